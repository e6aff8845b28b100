"""Which exported rows an off-policy trainer should not get: too stale, or straddling a weight sync.

A row is one training sample, so a filter drops whole rows, never part of one. That is what TRL
1.16's async GRPO does with ``max_staleness`` (``trl/experimental/async_grpo/async_grpo_trainer.py``,
its sample queue): each sample carries the policy version it was generated under, its staleness is
the trainer's current version minus that, and a sample whose staleness is *greater than*
``max_staleness`` is dropped whole (``staleness > max_staleness``; 0 keeps only the current
policy's). Masking the stale calls of a row instead would keep a sample whose trained tokens sit on
a context produced by the old policy, and would leave rows with no trained token for a trainer to
carry. Here a row's version is its *oldest*: the lowest ``policy_version_start`` of the calls it
is built from, since TRL stamps a sample with the version its rollout started under.

``drop_straddled`` drops every row that holds a call in flight across a weight sync
(``straddled_sync``: under a keep-mode pause, TRL's default, its first ids came from the old weights
and the rest from the new, on the old weights' KV cache), which no single policy version describes.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DropReason = Literal["stale", "straddled"]


class ExportFilters(BaseModel):
    """What an export leaves out; the defaults leave out nothing."""

    model_config = ConfigDict(frozen=True)

    max_staleness: int | None = Field(
        None, ge=0, description="Drop rows whose oldest policy version is more than this many versions behind "
        "current_version (TRL's max_staleness); None keeps every row")
    current_version: int | None = Field(
        None, description="The trainer's current policy version; None: the highest version the exported records "
        "hold (the CLI passes the highest its store or recorder knows)")
    current_version_source: str = Field(
        "given", description="Where current_version came from, for the report")
    drop_straddled: bool = Field(False, description="Drop rows holding a call that straddled a weight sync")

    @model_validator(mode="after")
    def _version_needs_staleness(self) -> ExportFilters:
        if self.current_version is not None and self.max_staleness is None:
            raise ValueError("current_version is only read by max_staleness; give max_staleness too")
        return self

    @property
    def active(self) -> bool:
        return self.max_staleness is not None or self.drop_straddled


class DropReport(BaseModel):
    """What the filters did to one export: rows before, rows kept, and each dropped row's reason
    (a row both stale and straddled counts as stale)."""

    rows: int = 0
    kept: int = 0
    dropped: dict[DropReason, int] = Field(default_factory=dict)
    max_staleness: int | None = None
    current_version: int | None = None
    current_version_source: str | None = None
    drop_straddled: bool = False
    unit: str = Field("row", description="What a row is in this format: row (a sample) or record (entries)")

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    def line(self) -> str:
        """One line for stderr: counts and why."""
        unit = self.unit + ("s" if self.rows != 1 else "")
        head = (f"dropped {self.dropped_total} of {self.rows} {unit}" if self.dropped_total
                else f"kept all {self.rows} {unit}")
        why: list[str] = []
        if self.max_staleness is not None and self.current_version is not None:
            stale = self.dropped.get("stale", 0)
            why.append(f"{stale} stale (oldest policy version below {self.current_version - self.max_staleness}; "
                       f"current version {self.current_version}, {self.current_version_source}; max staleness "
                       f"{self.max_staleness})")
        if self.drop_straddled:
            why.append(f"{self.dropped.get('straddled', 0)} straddled a weight sync")
        return head + (": " + ", ".join(why) if why else "")


def drop_reason(filters: ExportFilters, current_version: int | None, oldest_version: int,
                straddled: bool) -> DropReason | None:
    """Why a row with these versions is dropped, or None when it is kept (see the module docstring)."""
    if filters.max_staleness is not None and current_version is not None:
        if current_version - oldest_version > filters.max_staleness:
            return "stale"
    if filters.drop_straddled and straddled:
        return "straddled"
    return None


def report(filters: ExportFilters, current_version: int | None, rows: int, reasons: list[DropReason | None],
           unit: str = "row") -> DropReport:
    """The ``DropReport`` of one export, from each row's ``drop_reason``."""
    counts = Counter(reason for reason in reasons if reason is not None)
    return DropReport(rows=rows, kept=rows - sum(counts.values()), dropped=dict(counts),
                      max_staleness=filters.max_staleness, current_version=current_version,
                      current_version_source=(filters.current_version_source if filters.current_version is not None
                                              else "the highest in the exported records"),
                      drop_straddled=filters.drop_straddled, unit=unit)
