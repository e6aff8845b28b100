"""One session's records as an export: ``entries``, ``training`` or ``harness``, filtered, never empty.

What ``openenv-harness trace export`` runs, and what a Python pipeline calls with records it read
itself. Every format carries each call's policy versions (``policy_version_start``,
``policy_version_end``, ``straddled_sync``, the engine's ``weight_versions`` where recorded) and, for
rows built from several calls, the row's oldest start / newest end / any straddle
(``docs/exports.md``).

An export that would hand a trainer nothing to train is an error (``NothingToExport``), never an
empty success: a pipeline reading ``[]`` cannot tell "nothing happened" from "nothing was
recorded". For ``training`` and ``harness`` that is any export without one mask-1 id; for every
format, one whose filters dropped every row.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from openenv_harness.contract import call_versions, is_training_entry, training_entries
from openenv_harness.export.atif import atif_trajectory
from openenv_harness.export.filters import DropReason, DropReport, ExportFilters, drop_reason, report
from openenv_harness.export.training_rows import annotate_rows, row_summary, training_rows

ExportFormat = Literal["entries", "training", "harness", "atif"]
FORMATS: tuple[ExportFormat, ...] = ("entries", "training", "harness", "atif")


class NothingToExport(ValueError):
    """A known session whose export would hold nothing to train: one line saying why, and a hint."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True, slots=True)
class SessionExport:
    """An export's rows (``entries``: records; ``training``: OpenEnv's ``TrainingTrace``; ``harness``:
    ``HarnessTrace`` samples), what the filters dropped, and the text to write."""

    format: ExportFormat
    rows: Any
    report: DropReport

    def text(self) -> str:
        if self.format == "entries":
            return "".join(json.dumps(r) + "\n" for r in self.rows)
        if self.format == "training":
            return str(self.rows.model_dump_json(indent=1))
        if self.format == "atif":
            return json.dumps(self.rows, indent=1) + "\n"
        return json.dumps([t.model_dump() for t in self.rows], indent=1)


def highest_policy_version(records: Iterable[dict[str, Any]]) -> int | None:
    """The highest policy version any of ``records`` started or ended under; None for no records."""
    versions = [max(v.policy_version_start, v.policy_version_end) for v in map(call_versions, records)]
    return max(versions) if versions else None


def _current_version(filters: ExportFilters, records: list[dict[str, Any]]) -> int | None:
    if filters.max_staleness is None:
        return None
    return filters.current_version if filters.current_version is not None else highest_policy_version(records)


def export_entries(records: list[dict[str, Any]], filters: ExportFilters = ExportFilters()
                   ) -> tuple[list[dict[str, Any]], DropReport]:
    """The records as recorded (each carries its versions in ``metadata``); filtered per record, since
    a record is a row of this format."""
    current = _current_version(filters, records)
    reasons: list[DropReason | None] = []
    for record in records:
        v = call_versions(record)
        reasons.append(drop_reason(filters, current, v.policy_version_start, v.straddled_sync))
    kept = [r for r, why in zip(records, reasons, strict=True) if why is None]
    return kept, report(filters, current, len(records), reasons, unit="record")


def export_training(records: list[dict[str, Any]], *, non_policy: str = "mask",
                    filters: ExportFilters = ExportFilters()) -> tuple[Any, DropReport]:
    """OpenEnv's ``TrainingTrace`` (validated by OpenEnv's own models): one turn per agent call, its
    record's metadata (versions included) plus ``metadata.training_row``, the row TRL's reconciler puts
    it in and that row's versions. Filters drop whole rows (``training_rows``)."""
    from openenv.core.harness import TrainingTrace  # lazy: importing OpenEnv costs seconds

    turns = training_entries(records, non_policy)
    current = _current_version(filters, records)
    rows = training_rows(turns)
    reasons: list[DropReason | None] = []
    for row in rows:
        summary = row_summary([call_versions(turns[i]) for i in row])
        reasons.append(drop_reason(filters, current, summary["policy_version_start"], summary["straddled_sync"]))
    kept = [turns[i] for row, why in zip(rows, reasons, strict=True) if why is None for i in row]
    return TrainingTrace.from_entries(annotate_rows(kept)), report(filters, current, len(rows), reasons)


def export_harness(records: list[dict[str, Any]], *, strategy: str = "split", non_policy: str = "mask",
                   reward: float | None = None, filters: ExportFilters = ExportFilters()
                   ) -> tuple[list[Any], DropReport]:
    """Our assembler's ``HarnessTrace`` samples (``assembly/``): per segment the call's versions, per
    sample the oldest start / newest end / any straddle, which the filters read."""
    from openenv_harness.assembly import assemble_session

    assembled = assemble_session(records, strategy=strategy, non_policy=non_policy,  # type: ignore[arg-type]
                                 reward=reward)
    current = _current_version(filters, records)
    reasons = [drop_reason(filters, current, t.metadata.policy_version_start, t.metadata.straddled_sync)
               for t in assembled.traces]
    kept = [t for t, why in zip(assembled.traces, reasons, strict=True) if why is None]
    return kept, report(filters, current, len(assembled.traces), reasons)


def _trainable_ids(fmt: ExportFormat, rows: Any) -> int:
    if fmt == "atif":
        return 0 if rows is None else len(rows["steps"])
    if fmt == "training":
        return sum(sum(t.loss_mask[len(t.prompt_token_ids):]) for t in rows.turns)
    if fmt == "harness":
        return sum(sum(t.loss_mask) for t in rows)
    return sum(1 for _ in rows)


def _records_trainable(records: list[dict[str, Any]], non_policy: str) -> bool:
    """Whether any record offers a trainable sampled id (so filters, not the records, emptied an export)."""
    return any(any(e["loss_mask"][len(e["prompt_token_ids"]):]) for e in training_entries(records, non_policy))


#: why a record offers no trainable id: (one, several), for ``untrainable_reason``'s line
_CAUSES: dict[str, tuple[str, str]] = {
    "aux": ("aux call", "aux calls"),
    "unaligned": ("record without aligned tokens", "records without aligned tokens"),
    "empty": ("call with no sampled id", "calls with no sampled id"),
    "untrainable": ("call marked untrainable", "calls marked untrainable"),
    "constrained": ("call under a decoding constraint (logprobs not the policy's: mask 0)",
                    "calls under a decoding constraint (logprobs not the policy's: mask 0)"),
    "assembly": ("call whose ids the assembly kept as context only", "calls whose ids the assembly kept as context only"),
}


def _count(n: int, forms: tuple[str, str]) -> str:
    return f"{n} {forms[0] if n == 1 else forms[1]}"


def untrainable_reason(records: list[dict[str, Any]], non_policy: str = "mask") -> tuple[str, str]:
    """Why none of ``records`` offers a trainable sampled id, as counts per cause, and a hint."""
    causes: Counter[str] = Counter()
    for record in records:
        md = record.get("metadata") or {}
        if md.get("call_kind", "agent") != "agent":
            causes["aux"] += 1
        elif md.get("status", "ok") != "ok":
            causes[f"status:{md.get('status')}"] += 1
        elif not is_training_entry(record):
            causes["unaligned"] += 1
        elif not record.get("completion_token_ids"):
            causes["empty"] += 1
        elif md.get("trainable", True) is not True or not any(
                (record.get("loss_mask") or [])[len(record["prompt_token_ids"]):]):
            causes["untrainable"] += 1
        elif md.get("logprobs_are_policy", True) is False and non_policy == "mask":
            causes["constrained"] += 1
        else:
            causes["assembly"] += 1
    listed = ", ".join(
        _count(n, _CAUSES.get(cause) or (f"{cause[7:]} call", f"{cause[7:]} calls")) for cause, n in causes.items())
    hint = "--format entries exports the records as they are"
    if causes["constrained"]:
        hint = "--non-policy keep keeps constrained ids trainable for a trainer that recomputes old logprobs; " + hint
    return f"{_count(len(records), ('record', 'records'))}: {listed}", hint


def export_session(records: list[dict[str, Any]], format: ExportFormat = "entries", *, session_id: str | None = None,
                   strategy: str = "split", non_policy: str = "mask", reward: float | None = None,
                   filters: ExportFilters = ExportFilters()) -> SessionExport:
    """A known session's export in ``format``; ``NothingToExport`` when it would hold nothing to train
    (see the module docstring), ``ValueError`` for an unknown format or bad filters."""
    name = session_id or next((r.get("metadata", {}).get("session_id") for r in records), None) or "?"
    if not records:
        raise NothingToExport(f"no records for session {name}", "`openenv-harness trace list` shows the sessions")
    rows: Any
    if format == "entries":
        rows, dropped = export_entries(records, filters)
    elif format == "training":
        rows, dropped = export_training(records, non_policy=non_policy, filters=filters)
    elif format == "harness":
        rows, dropped = export_harness(records, strategy=strategy, non_policy=non_policy, reward=reward,
                                       filters=filters)
    elif format == "atif":
        kept, dropped = export_entries(records, filters)
        if not kept:
            rows = None
        else:
            try:
                rows = atif_trajectory(kept, session_id=session_id)
            except ValueError as exc:
                raise NothingToExport(f"session {name}: {exc}", "`openenv-harness trace show` shows its calls") from None
    else:
        raise ValueError(f"unknown format {format!r}; use {', '.join(FORMATS)}")
    if _trainable_ids(format, rows):
        return SessionExport(format=format, rows=rows, report=dropped)
    if dropped.dropped_total and (format == "entries" or _records_trainable(records, non_policy)):
        raise NothingToExport(f"session {name}: the filters left nothing to export ({dropped.line()})",
                              "raise --max-staleness, drop --drop-straddled, or pass --current-version")
    why, hint = untrainable_reason(records, non_policy)
    raise NothingToExport(f"session {name} has nothing trainable in format {format}: {why}", hint)
