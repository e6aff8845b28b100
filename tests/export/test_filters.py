"""The staleness and straddle rules: TRL's ``staleness > max_staleness`` on a row's oldest version."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from openenv_harness.export import DropReport, ExportFilters, drop_reason


@pytest.mark.parametrize(("max_staleness", "oldest", "expected"), [
    (2, 3, None),       # 5 - 3 = 2: exactly max_staleness behind is still kept (TRL drops only "> max")
    (2, 2, "stale"),    # 3 behind
    (0, 5, None),       # 0 keeps only the current policy's rows
    (0, 4, "stale"),
    (1, 7, None),       # a row newer than the given current version is not stale
])
def test_staleness_is_the_current_version_minus_the_rows_oldest(max_staleness: int, oldest: int,
                                                                 expected: str | None) -> None:
    filters = ExportFilters(max_staleness=max_staleness, current_version=5)
    assert drop_reason(filters, 5, oldest, straddled=False) == expected


def test_straddled_rows_are_dropped_only_when_asked_and_staleness_is_the_reason_named_first() -> None:
    assert drop_reason(ExportFilters(), None, 0, straddled=True) is None
    assert drop_reason(ExportFilters(drop_straddled=True), None, 0, straddled=True) == "straddled"
    assert drop_reason(ExportFilters(drop_straddled=True), None, 0, straddled=False) is None
    both = ExportFilters(max_staleness=0, current_version=3, drop_straddled=True)
    assert drop_reason(both, 3, 1, straddled=True) == "stale"
    assert not ExportFilters().active and ExportFilters(drop_straddled=True).active
    assert ExportFilters(max_staleness=0).active


def test_filters_refuse_what_they_cannot_mean() -> None:
    with pytest.raises(ValidationError, match="current_version is only read by max_staleness"):
        ExportFilters(current_version=3)
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        ExportFilters(max_staleness=-1)


def test_the_report_line_says_counts_and_why() -> None:
    report = DropReport(rows=5, kept=2, dropped={"stale": 2, "straddled": 1}, max_staleness=1, current_version=4,
                        current_version_source="the highest recorded in the store", drop_straddled=True)
    assert report.dropped_total == 3
    assert report.line() == ("dropped 3 of 5 rows: 2 stale (oldest policy version below 3; current version 4, the "
                             "highest recorded in the store; max staleness 1), 1 straddled a weight sync")
    kept = DropReport(rows=1, kept=1, drop_straddled=True, unit="record")
    assert kept.line() == "kept all 1 record: 0 straddled a weight sync"
