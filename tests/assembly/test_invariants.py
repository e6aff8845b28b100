import pytest

from openenv_harness.assembly import (
    AssemblyError,
    HarnessTrace,
    assemble_session,
    check_trace,
    check_traces,
)


@pytest.fixture
def built(toy):
    messages = [("system", [11]), ("user", [21])]
    p0 = toy.render(messages)
    p1 = toy.render(messages + [("assistant", [100]), ("tool", [301])])
    session = assemble_session(
        [toy.record(p0, [100, toy.EOT], call_index=0), toy.record(p1, [101, toy.EOT], call_index=1)]
    )
    (trace,) = session.traces
    return trace, {call.node_id: call for call in session.calls}


def _with(trace: HarnessTrace, **changes) -> HarnessTrace:
    metadata = changes.pop("metadata", None)
    data = trace.model_dump()
    data.update(changes)
    if metadata:
        data["metadata"].update(metadata)
    return HarnessTrace.model_construct(**{**data, "metadata": type(trace.metadata).model_validate(data["metadata"])})


def test_a_built_trace_passes(built) -> None:
    trace, calls = built
    check_trace(trace, calls)
    check_traces([trace], calls.values())


def _flip(values: list, index: int, value) -> list:
    values = list(values)
    values[index] = value
    return values


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda t: {"loss_mask": t.loss_mask[:-1]}, "misaligned"),
        (lambda t: {"response_logprobs": t.response_logprobs + [0.0]}, "misaligned"),
        (lambda t: {"response_logprobs": _flip(t.response_logprobs, 0, 0.2)}, "mask-1 position 0"),
        (lambda t: {"response_logprobs": _flip(t.response_logprobs, 0, float("nan"))}, "mask-1 position 0"),
        (lambda t: {"response_logprobs": _flip(t.response_logprobs, 2, -0.5)}, "mask-0 position 2"),
        (lambda t: {"loss_mask": _flip(t.loss_mask, 2, 2)}, "must be 0 or 1"),
        (lambda t: {"prompt_ids": []}, "prompt_ids is empty"),
        (lambda t: {"reward": float("inf")}, "reward"),
        (lambda t: {"metadata": {"trainable_tokens": 1}}, "trainable_tokens"),
        (
            lambda t: {
                "metadata": {"segments": [t.metadata.segments[1].model_dump(), t.metadata.segments[0].model_dump()]}
            },
            "overlaps",
        ),
    ],
)
def test_structural_violations_are_caught(built, make, message: str) -> None:
    trace, _ = built
    with pytest.raises(AssemblyError, match=message):
        check_trace(_with(trace, **make(trace)))


def test_changed_context_is_caught_unless_labelled_approximate(built) -> None:
    trace, calls = built
    tampered = _with(trace, response_ids=_flip(trace.response_ids, 3, 999))  # inside the interstitial
    with pytest.raises(AssemblyError, match="context of sess/1"):
        check_trace(tampered, calls)
    check_trace(_with(tampered, metadata={"approximate": True}), calls)


def test_identity_violations_are_caught(built) -> None:
    trace, calls = built
    with pytest.raises(AssemblyError, match="not reproduced verbatim"):
        check_trace(_with(trace, response_ids=_flip(trace.response_ids, 0, 999)), calls)
    moved = _flip(_flip(trace.loss_mask, 0, 0), 2, 1)
    moved_logps = _flip(_flip(trace.response_logprobs, 0, 0.0), 2, -0.1)
    with pytest.raises(AssemblyError, match="loss_mask is not 1 exactly"):
        check_trace(_with(trace, loss_mask=moved, response_logprobs=moved_logps), calls)
    with pytest.raises(AssemblyError, match="does not end"):
        check_trace(
            _with(
                trace,
                response_ids=trace.response_ids + [7],
                loss_mask=trace.loss_mask + [0],
                response_logprobs=trace.response_logprobs + [0.0],
            ),
            calls,
        )
    with pytest.raises(AssemblyError, match="unknown call"):
        check_trace(trace, {"sess/0": calls["sess/0"]})
