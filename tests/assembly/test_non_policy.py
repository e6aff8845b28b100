"""Logprobs that are not the policy's (a call under a decoding constraint) are never offered as
trainable by default, and every row and segment says which logprobs are the policy's."""

from __future__ import annotations

import pytest

from openenv_harness.assembly import AssemblyError, assemble_session, compare_strategies, select_calls
from openenv_harness.assembly.invariants import check_trace


@pytest.fixture
def session(toy) -> list[dict]:
    """Three exact calls; the middle one ran under ``tool_choice: "required"`` (post-mask logprobs)."""
    EOT, make_record, render = toy.EOT, toy.record, toy.render
    first_prompt = render([("system", [10]), ("user", [11, 12])])
    first = [20, 21, EOT]
    second_prompt = first_prompt + first + [6] + render([("tool", [30])])
    second = [40, 41, 42, EOT]
    third_prompt = second_prompt + second + [6] + render([("tool", [31])])
    third = [50, EOT]
    records = [make_record(first_prompt, first, call_index=0),
               make_record(second_prompt, second, call_index=1, logps=[-1e-9, -14.0, -0.1, -1e-9]),
               make_record(third_prompt, third, call_index=2)]
    records[1]["metadata"]["logprobs_are_policy"] = False
    return records


def test_constrained_ids_are_masked_and_flagged_by_default(session) -> None:
    [trace] = assemble_session(session).traces
    segments = {s.node_id: s for s in trace.metadata.segments}
    assert [s.logprobs_are_policy for s in trace.metadata.segments] == [True, False, True]
    constrained = segments["sess/1"]
    assert constrained.trainable_tokens == 0
    span = slice(constrained.offset, constrained.offset + constrained.length)
    assert trace.loss_mask[span] == [0, 0, 0, 0], "post-mask logprobs are not offered as the policy's"
    assert trace.response_logprobs[span] == [0.0] * 4, "mask 0 carries the 0.0 filler, never the post-mask value"
    assert trace.metadata.non_policy_node_ids == ["sess/1"]
    assert trace.metadata.non_policy_tokens == 4 and trace.metadata.non_policy_trainable_tokens == 0
    assert trace.metadata.trainable_tokens == 3 + 2, "the policy's calls stay trainable"
    check_trace(trace)


def test_keep_leaves_them_trainable_and_says_so(session) -> None:
    [trace] = assemble_session(session, non_policy="keep").traces
    constrained = next(s for s in trace.metadata.segments if s.node_id == "sess/1")
    assert not constrained.logprobs_are_policy and constrained.trainable_tokens == 4
    span = slice(constrained.offset, constrained.offset + constrained.length)
    assert trace.response_logprobs[span] == [-1e-9, -14.0, -0.1, -1e-9]
    assert trace.metadata.non_policy_trainable_tokens == 4


def test_stats_count_them_per_strategy(session) -> None:
    for stats in compare_strategies(session).values():
        assert stats.non_policy_tokens == 4 and stats.non_policy_trainable_tokens == 0


def test_a_record_without_the_flag_is_the_policys(session) -> None:
    records = session
    del records[1]["metadata"]["logprobs_are_policy"]
    assert all(call.logprobs_are_policy for call in select_calls(records).calls)
    assert assemble_session(records).traces[0].metadata.non_policy_tokens == 0


def test_an_unknown_choice_is_refused(session) -> None:
    with pytest.raises(AssemblyError, match="non_policy"):
        assemble_session(session, non_policy="trust")  # type: ignore[arg-type]


def test_each_segment_carries_its_calls_effective_sampling(session) -> None:
    """What importance sampling corrected for truncated sampling (TRL >= 1.17 under top-k / top-p / min-p)
    needs per token: each call's effective settings, on its segment; None where a record does not say."""
    settings = [{"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0},
                {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.05}]
    for record, effective in zip(session, settings):
        record["metadata"].setdefault("provenance", {})["sampling_effective"] = effective
    [trace] = assemble_session(session).traces
    assert [s.sampling for s in trace.metadata.segments] == [*settings, None]
    assert trace.model_dump()["metadata"]["segments"][1]["sampling"] == settings[1]  # exported as it is
