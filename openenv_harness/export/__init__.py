"""Exports of recorded sessions for trainers: formats, policy versions per row, staleness filters.

Typical use, with records read from a store or recorder::

    done = export_session(records, "harness", filters=ExportFilters(max_staleness=2, drop_straddled=True))
    done.rows, done.report.line(), done.text()

``docs/exports.md`` says what each format carries and what the filters drop.
"""

from openenv_harness.export.filters import DropReason, DropReport, ExportFilters, drop_reason
from openenv_harness.export.session import (
    FORMATS,
    ExportFormat,
    NothingToExport,
    SessionExport,
    export_entries,
    export_harness,
    export_session,
    export_training,
    highest_policy_version,
    untrainable_reason,
)
from openenv_harness.export.training_rows import annotate_rows, row_summary, training_rows

__all__ = [
    "FORMATS",
    "DropReason",
    "DropReport",
    "ExportFilters",
    "ExportFormat",
    "NothingToExport",
    "SessionExport",
    "annotate_rows",
    "drop_reason",
    "export_entries",
    "export_harness",
    "export_session",
    "export_training",
    "highest_policy_version",
    "row_summary",
    "training_rows",
    "untrainable_reason",
]
