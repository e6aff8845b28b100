"""Property tests over generated sessions on the toy template.

A generated session interleaves up to three agents (a main agent and sub-agents with their own
system prompt) on the toy template. Each reply is a list of words; a splittable word may be
sampled as two piece ids, while the next prompt re-encodes it canonically as one id (replay
drift, like ``[fish, ing]`` -> ``[fishing]``). The harness sometimes re-serializes a reply (the
next prompt carries a different word), compacts an agent's history (a break), retries a call
(the same prompt twice), or records aux, failed, invalid and untrainable calls.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openenv_harness.assembly import (
    AssembledSession,
    assemble_session,
    check_traces,
    group_chains,
    select_calls,
)

PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
AGENT_EVENTS = ["turn"] * 6 + ["retry", "invalid", "untrainable", "compact", "failed"]


def _pieces(word: int) -> list[int]:
    return [1000 + 2 * word, 1001 + 2 * word]


@st.composite
def scripts(draw: st.DrawFn) -> tuple[int, list[dict[str, Any]]]:
    agents = draw(st.integers(min_value=1, max_value=3))
    events: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(min_value=1, max_value=14))):
        if draw(st.integers(min_value=0, max_value=12)) == 0:
            events.append({"kind": "aux"})
            continue
        kind = draw(st.sampled_from(AGENT_EVENTS))
        event: dict[str, Any] = {"kind": kind, "agent": draw(st.integers(min_value=0, max_value=agents - 1))}
        if kind == "compact":
            event["summary"] = draw(st.lists(st.integers(min_value=140, max_value=149), min_size=1, max_size=3))
        elif kind != "failed":
            words = draw(st.lists(st.integers(min_value=100, max_value=139), min_size=1, max_size=5))
            event.update(
                words=words,
                splits=draw(st.lists(st.booleans(), min_size=len(words), max_size=len(words))),
                finish=draw(st.sampled_from(["stop", "stop", "tool_calls", "length"])),
                rewrite=draw(st.integers(min_value=0, max_value=4)) == 0,
                tool=draw(st.lists(st.integers(min_value=300, max_value=310), min_size=1, max_size=3)),
            )
        events.append(event)
    return agents, events


def materialize(script: tuple[int, list[dict[str, Any]]], toy: Any) -> list[dict[str, Any]]:
    """Play a script through the toy template and return the records a recorder would have written."""
    n_agents, events = script
    histories = [[("system", [11, 50 + a]), ("user", [60 + a, 61])] for a in range(n_agents)]
    records: list[dict[str, Any]] = []
    for event in events:
        index = len(records)
        if event["kind"] == "aux":
            records.append(toy.record([toy.SYS, 99, toy.EOT], [7, toy.EOT], call_index=index, call_kind="aux"))
            continue
        agent = event["agent"]
        history = histories[agent]
        if event["kind"] == "compact":
            histories[agent] = [history[0], ("user", event["summary"])]
            continue
        prompt = toy.render(history)
        if event["kind"] == "failed":
            records.append(toy.record(prompt, [], call_index=index, status="failed", finish_reason=None))
            continue
        sampled: list[int] = []
        for word, split in zip(event["words"], event["splits"], strict=True):
            sampled += _pieces(word) if split and word % 3 == 0 else [word]
        completion = sampled + ([] if event["finish"] == "length" else [toy.EOT])
        status = "invalid" if event["kind"] == "invalid" else "ok"
        trainable = event["kind"] not in ("invalid", "untrainable")
        records.append(
            toy.record(
                prompt, completion, call_index=index, status=status, trainable=trainable, finish_reason=event["finish"]
            )
        )
        if event["kind"] == "retry":
            continue  # the harness dropped this reply and asks again later
        stored = list(event["words"])
        if event["rewrite"]:
            stored[0] += 1  # re-serialized by the harness: same meaning, other tokens
        histories[agent] = history + [("assistant", stored), ("tool", event["tool"])]
    return records


def _by_node(session: AssembledSession) -> dict[str, Any]:
    return {call.node_id: call for call in session.calls}


def _mask_one_contexts_are_exact(session: AssembledSession) -> None:
    calls = _by_node(session)
    for trace in session.traces:
        full = trace.prompt_ids + trace.response_ids
        base = len(trace.prompt_ids)
        covered = [False] * len(trace.response_ids)
        for segment in trace.metadata.segments:
            call = calls[segment.node_id]
            start = base + segment.offset
            assert full[:start] == call.prompt, "a sampled span sits on a context the engine never saw"
            expected = call.completion[: segment.length] if segment.partial else call.completion
            assert full[start : start + segment.length] == expected
            covered[segment.offset : segment.offset + segment.length] = [True] * segment.length
        assert all(covered[i] for i, flag in enumerate(trace.loss_mask) if flag == 1)


@PROPERTY_SETTINGS
@given(script=scripts())
def test_split_trains_every_sampled_token_exactly_once(script, toy) -> None:
    records = materialize(script, toy)
    session = assemble_session(records, strategy="split")
    placements: dict[str, list[tuple[int, int]]] = {}
    for t_index, trace in enumerate(session.traces):
        for segment in trace.metadata.segments:
            placements.setdefault(segment.node_id, []).append((t_index, segment.offset))
    for call in session.calls:
        assert len(placements.get(call.node_id, [])) == 1, f"{call.node_id} placed {placements.get(call.node_id)}"
        t_index, offset = placements[call.node_id][0]
        trace = session.traces[t_index]
        assert trace.response_ids[offset : offset + len(call.completion)] == call.completion
        assert trace.loss_mask[offset : offset + len(call.completion)] == call.mask
        assert trace.response_logprobs[offset : offset + len(call.completion)] == call.logprobs
    trainable_records = [r for r in records if r["metadata"]["status"] == "ok" and r["metadata"]["trainable"]]
    expected = sum(len(r["completion_token_ids"]) for r in trainable_records if r["metadata"]["call_kind"] == "agent")
    assert sum(sum(t.loss_mask) for t in session.traces) == expected
    assert session.stats.resolutions.split == session.stats.replay_drift


@PROPERTY_SETTINGS
@given(script=scripts())
def test_mask_one_tokens_keep_the_context_the_engine_saw(script, toy) -> None:
    records = materialize(script, toy)
    for strategy in ("split", "realign"):
        session = assemble_session(records, strategy=strategy)
        _mask_one_contexts_are_exact(session)
        check_traces(session.traces, session.calls)
        assert not any(t.metadata.approximate for t in session.traces)
        for trace in session.traces:  # no sample ever spans two chains
            chain = session.chains[trace.metadata.chain_id]
            assert set(trace.metadata.node_ids) <= set(chain.node_ids)


@PROPERTY_SETTINGS
@given(script=scripts(), data=st.data())
def test_grouping_never_consults_sampled_ids(script, data, toy) -> None:
    records = materialize(script, toy)
    before = group_chains(select_calls(records).calls)
    for record in records:
        if record["metadata"]["status"] == "failed":
            continue
        completion = data.draw(st.lists(st.integers(min_value=0, max_value=2000), max_size=6))
        record["completion_token_ids"] = completion
        record["per_token_logps"] = [-0.5] * len(completion)
        record["loss_mask"] = [0] * len(record["prompt_token_ids"]) + [int(record["metadata"]["trainable"])] * len(
            completion
        )
    after = group_chains(select_calls(records).calls)
    assert [c.node_ids for c in after.chains] == [c.node_ids for c in before.chains]
    assert [(t.to_node, t.from_node, t.cause) for t in after.transitions if t.kind == "break"] == [
        (t.to_node, t.from_node, t.cause) for t in before.transitions if t.kind == "break"
    ]


@PROPERTY_SETTINGS
@given(script=scripts())
def test_every_strategy_places_every_call_in_exactly_one_sample(script, toy) -> None:
    records = materialize(script, toy)
    for strategy in ("split", "realign", "approximate"):
        session = assemble_session(records, strategy=strategy)
        check_traces(session.traces, session.calls)
        seen = [node for trace in session.traces for node in trace.metadata.node_ids]
        assert sorted(seen) == sorted(call.node_id for call in session.calls)
        for trace in session.traces:
            assert len(trace.loss_mask) == len(trace.response_ids) == len(trace.response_logprobs)
            assert trace.reward is None


@PROPERTY_SETTINGS
@given(script=scripts())
def test_realign_loses_exactly_the_drifted_actions(script, toy) -> None:
    records = materialize(script, toy)
    split = assemble_session(records, strategy="split")
    realign = assemble_session(records, strategy="realign", realign_max_tokens=10_000)
    calls = _by_node(split)
    drifts = [t for t in split.transitions if t.kind == "replay_drift"]
    drifted = [t.from_node for t in drifts]
    lost = 0  # only from the first differing id on: the exact prefix of a drifted reply stays trainable
    for t in drifts:
        prev, call = calls[t.from_node], calls[t.to_node]
        replay = call.prompt[len(prev.prompt):]
        kept = next((i for i, (a, b) in enumerate(zip(prev.completion, replay)) if a != b),
                    min(len(prev.completion), len(replay)))
        lost += sum(prev.mask[kept:])
    realigned = [node for trace in realign.traces for node in trace.metadata.realigned_node_ids]
    assert sorted(realigned) == sorted(drifted)
    assert realign.stats.resolutions.lost_tokens == lost
    assert realign.stats.trainable_tokens == split.stats.trainable_tokens - lost
    assert len(realign.traces) == len(split.chains)
    gated_everywhere = assemble_session(records, strategy="realign", realign_max_tokens=0)
    assert [t.input_ids for t in gated_everywhere.traces] == [t.input_ids for t in split.traces]
    assert gated_everywhere.stats.resolutions.realign_gated == split.stats.replay_drift


@PROPERTY_SETTINGS
@given(script=scripts())
def test_approximate_is_always_labelled(script, toy) -> None:
    records = materialize(script, toy)
    split = assemble_session(records, strategy="split")
    approximate = assemble_session(records, strategy="approximate", eot_id=toy.EOT)
    assert approximate.stats.resolutions.spliced == split.stats.replay_drift  # the toy template always closes with EOT
    assert approximate.stats.trainable_tokens == split.stats.trainable_tokens
    for trace in approximate.traces:
        assert trace.metadata.approximate == bool(trace.metadata.spliced_node_ids)
        if not trace.metadata.approximate:
            check_traces([trace], approximate.calls)
    assert approximate.stats.approximate_traces == sum(1 for t in approximate.traces if t.metadata.spliced_node_ids)
