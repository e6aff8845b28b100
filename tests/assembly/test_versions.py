"""Policy versions in assembled samples: per segment, the sample's summary, checked by the invariants."""

from __future__ import annotations

import pytest

from openenv_harness.assembly import AssemblyError, assemble_session, check_trace

FISH, ING, FISHING = 201, 202, 203


def _versions(record: dict, start: int, end: int, spans: list[dict] | None = None) -> dict:
    record["metadata"].update(policy_version_start=start, policy_version_end=end, straddled_sync=start != end)
    if spans is not None:
        record["metadata"]["weight_versions"] = spans
    return record


def test_a_realigned_prefix_keeps_its_calls_versions_and_only_its_own_spans(toy) -> None:
    """Call 0 sampled [21, fish, ing, eot] across a sync (spans: id 0 old weights, ids 1-3 new); the replay
    keeps [21]: the partial segment carries the call's versions and the spans clipped to its one id."""
    messages = [("system", [11]), ("user", [21])]
    p0 = toy.render(messages)
    p1 = toy.render(messages + [("assistant", [21, FISHING]), ("tool", [301])])
    records = [
        _versions(toy.record(p0, [21, FISH, ING, toy.EOT], call_index=0), 3, 4,
                  [{"version": "w3", "start": 0, "end": 1}, {"version": "w4", "start": 1, "end": 4}]),
        _versions(toy.record(p1, [7, 5], call_index=1), 4, 4),
    ]
    (trace,) = assemble_session(records, strategy="realign").traces
    first, last = trace.metadata.segments
    assert first.partial and first.length == 1
    assert (first.policy_version_start, first.policy_version_end, first.straddled_sync) == (3, 4, True)
    assert [s.model_dump() for s in first.weight_versions or []] == [{"version": "w3", "start": 0, "end": 1}]
    assert (last.policy_version_start, last.straddled_sync, last.weight_versions) == (4, False, None)
    md = trace.metadata
    assert (md.policy_version_start, md.policy_version_end, md.straddled_sync, md.straddled_node_ids) == (
        3, 4, True, ["sess/0"])


def test_a_straddle_flag_without_differing_versions_still_counts(toy) -> None:
    """The recorder may flag a call that read the version right after a bump; the flag is never dropped."""
    record = toy.record(toy.render([("user", [21])]), [7, toy.EOT], call_index=0)
    record["metadata"].update(policy_version_start=2, policy_version_end=2, straddled_sync=True)
    (trace,) = assemble_session([record]).traces
    assert trace.metadata.segments[0].straddled_sync and trace.metadata.straddled_sync


def test_records_without_versions_get_the_schemas_defaults(toy) -> None:
    (trace,) = assemble_session([toy.record(toy.render([("user", [21])]), [7, toy.EOT], call_index=0)]).traces
    md = trace.metadata
    assert (md.policy_version_start, md.policy_version_end, md.straddled_sync) == (0, 0, False)


def test_the_invariants_refuse_versions_that_disagree(toy) -> None:
    records = [_versions(toy.record(toy.render([("user", [21])]), [7, toy.EOT], call_index=0), 1, 2)]
    session = assemble_session(records)
    (trace,) = session.traces
    calls = {call.node_id: call for call in session.calls}
    summary = trace.model_copy(update={"metadata": trace.metadata.model_copy(update={"straddled_sync": False})})
    with pytest.raises(AssemblyError, match="policy versions .* disagree with its segments'"):
        check_trace(summary)
    segment = trace.metadata.segments[0].model_copy(update={"policy_version_start": 2, "straddled_sync": False})
    md = trace.metadata.model_copy(update={"segments": [segment], "policy_version_start": 2, "straddled_sync": False,
                                           "straddled_node_ids": []})
    with pytest.raises(AssemblyError, match="does not carry its call's policy versions"):
        check_trace(trace.model_copy(update={"metadata": md}), calls)
    check_trace(trace, calls)  # the assembled trace itself passes
