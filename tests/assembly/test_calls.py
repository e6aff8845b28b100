import math

import pytest

from openenv_harness.assembly import (
    AssemblyError,
    call_from_entry,
    detect_eot,
    select_calls,
)


def test_selection_keeps_agent_calls_in_call_order_and_counts_the_rest(toy) -> None:
    records = [
        toy.record([1, 2], [7, toy.EOT], call_index=2),
        toy.record([1, 2], [8, toy.EOT], call_index=0),
        toy.record([9], [9], call_index=1, call_kind="aux"),
        toy.record([], [], call_index=3, status="failed", finish_reason=None),
        toy.record([1, 2], [8, 9], call_index=4, status="invalid", logps=[0.0, 0.0]),
        toy.record([1, 2], [8, 9], call_index=5),
    ]
    records[5]["per_token_logps"] = [0.0]  # misaligned: not usable at all
    selection = select_calls(records)
    assert [c.call_index for c in selection.calls] == [0, 2]
    assert selection.excluded == {"aux": 1, "failed": 1, "invalid": 1, "unusable": 1}
    assert selection.session_id == "sess"


def test_untrainable_record_is_context_only(toy) -> None:
    entry = toy.record([1, 2], [7, 8], call_index=0, trainable=False, logps=[float("nan"), 0.5])
    call = call_from_entry(entry)
    assert call.mask == [0, 0]
    assert call.logprobs == [0.0, 0.0]
    assert call.trainable_tokens == 0


def test_record_loss_mask_narrows_trainable_ids(toy) -> None:
    entry = toy.record([1, 2], [7, 8, 9], call_index=0)
    entry["loss_mask"] = [0, 0, 1, 0, 1]
    call = call_from_entry(entry)
    assert call.mask == [1, 0, 1]
    assert call.logprobs[1] == 0.0 and call.logprobs[0] < 0


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda e: e["metadata"].pop("node_id"), "node_id"),
        (lambda e: e["metadata"].update(session_id=""), "session_id"),
        (lambda e: e["metadata"].update(call_index="0"), "call_index"),
        (lambda e: e.update(prompt_token_ids=[1, -2]), "prompt_token_ids"),
        (lambda e: e.update(completion_token_ids=[1.5, 2]), "completion_token_ids"),
        (lambda e: e.update(per_token_logps=[-0.1, 0.3]), "logprob 0.3"),
        (lambda e: e.update(per_token_logps=[-0.1, math.inf]), "logprob inf"),
        (lambda e: e.update(loss_mask=[0, 0, 1]), "loss_mask must have"),
        (lambda e: e.update(loss_mask=[1, 0, 1, 1]), "prompt token"),
        (lambda e: e.update(loss_mask=[0, 0, 2, 1]), "0 or 1"),
    ],
)
def test_malformed_records_fail_with_a_named_error(toy, mutate, message: str) -> None:
    entry = toy.record([1, 2], [7, 8], call_index=0)
    mutate(entry)
    with pytest.raises(AssemblyError, match=message):
        select_calls([entry])


def test_mixed_sessions_and_duplicate_ids_are_rejected(toy) -> None:
    a = toy.record([1], [2], call_index=0, session_id="a")
    b = toy.record([1], [2], call_index=0, session_id="b")
    with pytest.raises(AssemblyError, match="several sessions"):
        select_calls([a, b])
    with pytest.raises(AssemblyError, match="appears twice"):
        select_calls([a, toy.record([1], [3], call_index=0, session_id="a", seq=9)])
    with pytest.raises(AssemblyError, match="must be a dict"):
        select_calls([[1, 2]])  # type: ignore[list-item]


def test_eot_is_the_last_id_of_the_first_natural_stop(toy) -> None:
    calls = select_calls(
        [
            toy.record([1], [7, 8], call_index=0, finish_reason="length"),
            toy.record([1, 7], [9, 42], call_index=1, finish_reason="tool_calls"),
            toy.record([1, 7, 9], [10, 5], call_index=2, finish_reason="stop"),
        ]
    ).calls
    assert detect_eot(calls) == 42
    assert detect_eot(calls[:1]) is None


def test_finish_reason_falls_back_to_the_response(toy) -> None:
    entry = toy.record([1], [7, 31], call_index=0)
    entry["metadata"].pop("finish_reason")
    assert call_from_entry(entry).finish_reason == "stop"
    assert detect_eot([call_from_entry(entry)]) == 31
