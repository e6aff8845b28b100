"""``export_session`` per format: versions on every row, whole rows filtered, no empty success."""

from __future__ import annotations

import json

import pytest
from export_records import Records

from openenv_harness.assembly import AssemblyError, HarnessTrace
from openenv_harness.export import ExportFilters, NothingToExport, export_session, highest_policy_version


def _two_rows(session: Records) -> list[dict]:
    """Row 0: a straddled call then a call after the sync; row 1: a new conversation at version 2."""
    session.call((0, 1))
    session.call((1, 1), weight_versions=[{"version": "v1", "start": 0, "end": 3}])
    session.call((2, 2), fresh=True)
    return session.records


def test_harness_rows_carry_each_segments_versions_and_the_rows_summary(session: Records) -> None:
    rows = export_session(_two_rows(session), "harness").rows
    assert len(rows) == 2
    first = rows[0].metadata
    assert [(s.policy_version_start, s.policy_version_end, s.straddled_sync) for s in first.segments] == [
        (0, 1, True), (1, 1, False)]
    assert first.segments[0].weight_versions is None
    assert [span.model_dump() for span in first.segments[1].weight_versions or []] == [
        {"version": "v1", "start": 0, "end": 3}]
    assert (first.policy_version_start, first.policy_version_end, first.straddled_sync) == (0, 1, True)
    assert first.straddled_node_ids == ["s/0"]
    assert sum(rows[0].loss_mask) == 6, "a straddled call stays trainable unless a filter drops its row"
    second = rows[1].metadata
    assert (second.policy_version_start, second.policy_version_end, second.straddled_sync) == (2, 2, False)


def test_harness_json_round_trips_through_the_model(session: Records) -> None:
    done = export_session(_two_rows(session), "harness")
    rows = [HarnessTrace.model_validate(row) for row in json.loads(done.text())]
    assert rows == done.rows


def test_training_turns_carry_the_calls_versions_and_the_row_they_land_in(session: Records) -> None:
    from openenv.core.harness import TrainingTrace

    done = export_session(_two_rows(session), "training")
    trace = TrainingTrace.model_validate_json(done.text())  # OpenEnv's own models accept it
    md = [turn.metadata for turn in trace.turns]
    assert [(m["policy_version_start"], m["policy_version_end"], m["straddled_sync"]) for m in md] == [
        (0, 1, True), (1, 1, False), (2, 2, False)]
    assert md[1]["weight_versions"] == [{"version": "v1", "start": 0, "end": 3}]
    assert [m["training_row"] for m in md] == [
        {"index": 0, "policy_version_start": 0, "policy_version_end": 1, "straddled_sync": True},
        {"index": 0, "policy_version_start": 0, "policy_version_end": 1, "straddled_sync": True},
        {"index": 1, "policy_version_start": 2, "policy_version_end": 2, "straddled_sync": False}]


def test_entries_are_the_records_with_their_versions(session: Records) -> None:
    records = _two_rows(session)
    lines = export_session(records, "entries").text().splitlines()
    assert [json.loads(line) for line in lines] == records
    assert json.loads(lines[0])["metadata"]["straddled_sync"] is True


@pytest.mark.parametrize("fmt", ["harness", "training"])
def test_filters_drop_whole_rows(session: Records, fmt: str) -> None:
    records = _two_rows(session)
    straddle = export_session(records, fmt, filters=ExportFilters(drop_straddled=True))  # type: ignore[arg-type]
    stale = export_session(records, fmt, filters=ExportFilters(max_staleness=1))  # type: ignore[arg-type]
    for done in (straddle, stale):
        kept = ([t.metadata.node_ids for t in done.rows] if fmt == "harness"
                else [[turn.node_id for turn in done.rows.turns]])
        assert kept == [["s/2"]], "the call after the sync goes with its row, although it is fresh itself"
        assert (done.report.rows, done.report.kept) == (2, 1)
    assert straddle.report.dropped == {"straddled": 1}
    assert stale.report.dropped == {"stale": 1}
    assert stale.report.current_version == 2, "by default the highest version the records hold"
    assert "the highest in the exported records" in stale.report.line()
    keep_all = export_session(records, fmt, filters=ExportFilters(max_staleness=2))  # type: ignore[arg-type]
    assert keep_all.report.dropped_total == 0 and keep_all.report.kept == 2


def test_entries_are_filtered_record_by_record(session: Records) -> None:
    records = _two_rows(session)
    done = export_session(records, "entries", filters=ExportFilters(drop_straddled=True))
    assert [r["metadata"]["node_id"] for r in done.rows] == ["s/1", "s/2"]
    assert done.report.line() == "dropped 1 of 3 records: 1 straddled a weight sync"
    given = export_session(records, "entries", filters=ExportFilters(max_staleness=0, current_version=1))
    assert [r["metadata"]["node_id"] for r in given.rows] == ["s/1", "s/2"]  # s/0 starts at 0; s/2 is newer
    assert "current version 1, given" in given.report.line()


@pytest.mark.parametrize("fmt", ["entries", "training", "harness"])
def test_filters_that_drop_everything_are_an_error_in_every_format(session: Records, fmt: str) -> None:
    records = _two_rows(session)
    with pytest.raises(NothingToExport, match=r"session s: the filters left nothing to export \(dropped") as info:
        export_session(records, fmt, filters=ExportFilters(max_staleness=0, current_version=9))  # type: ignore[arg-type]
    assert info.value.hint and "--max-staleness" in info.value.hint


@pytest.mark.parametrize("fmt", ["training", "harness"])
def test_a_session_with_nothing_trainable_is_an_error_saying_why(fmt: str) -> None:
    failed = Records()
    failed.call(status="failed")
    failed.call(call_kind="aux")
    with pytest.raises(NothingToExport, match=rf"session s has nothing trainable in format {fmt}: 2 records: "
                       r"1 failed call, 1 aux call"):
        export_session(failed.records, fmt)  # type: ignore[arg-type]
    constrained = Records()
    constrained.call(constrained=True)
    with pytest.raises(NothingToExport, match="1 call under a decoding constraint") as info:
        export_session(constrained.records, fmt)  # type: ignore[arg-type]
    assert info.value.hint and "--non-policy keep" in info.value.hint
    kept = export_session(constrained.records, fmt, non_policy="keep")  # type: ignore[arg-type]
    assert kept.rows, "kept trainable on request, the same records export"


def test_entries_without_filters_export_untrainable_records_as_they_are() -> None:
    failed = Records()
    failed.call(status="failed")
    assert [r["metadata"]["status"] for r in export_session(failed.records, "entries").rows] == ["failed"]


def test_no_records_and_a_bad_format_are_errors(session: Records) -> None:
    with pytest.raises(NothingToExport, match="no records for session s-x"):
        export_session([], "harness", session_id="s-x")
    session.call()
    with pytest.raises(ValueError, match="unknown format 'csv'"):
        export_session(session.records, "csv")  # type: ignore[arg-type]


def test_malformed_versions_are_named_not_guessed(session: Records) -> None:
    session.call((0, 0), policy_version_end="1")
    with pytest.raises(AssemblyError, match="s/0: metadata.policy_version_end must be an integer"):
        export_session(session.records, "harness")
    with pytest.raises(ValueError, match="s/0: metadata.policy_version_end must be an integer"):
        export_session(session.records, "entries", filters=ExportFilters(drop_straddled=True))
    spans = Records()
    spans.call(weight_versions=[{"version": "v", "start": 3, "end": 1}])
    with pytest.raises(AssemblyError, match="span ends before it starts"):
        export_session(spans.records, "harness")
    spans = Records()
    spans.call(weight_versions=[{"start": 0, "end": 1}])
    with pytest.raises(AssemblyError, match="not a list of"):
        export_session(spans.records, "harness")


def test_highest_policy_version_reads_starts_and_ends(session: Records) -> None:
    assert highest_policy_version([]) is None
    session.call((3, 4))
    session.call((2, 2), fresh=True)
    assert highest_policy_version(session.records) == 4
