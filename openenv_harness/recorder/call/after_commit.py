"""Part of the record step: what follows a durable record, in order, for every way a call ends.

Why hooks after the commit: each of these changes what later calls see -- the chain's tips, the
retry window, the prompt mode's checkpoints, the session's counts -- so none may run for a record
the store did not take (the call then gives back its number and budget: ``durable.py``). A hook
reads the stored record and the flow; which ones act depends on how the call ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.call.pending import was_served
from openenv_harness.recorder.prompt_modes.registry import mode_for
from openenv_harness.recorder.store.base import PendingRecord

#: one hook: the flow, its stored record and the record's seq
AfterCommit = Callable[[Flow, PendingRecord, int], None]


def place_in_chain(flow: Flow, pending: PendingRecord, seq: int) -> None:
    """An observed agent call's prompt can be read back from its record from now on; a compaction
    call's summary is what a later break may carry (``chain/observer.py``)."""
    chain = flow.session.chain
    if "fidelity" in pending.metadata:
        chain.placed(pending.metadata["node_id"], seq)
    elif was_served(pending) and flow.call_kind == "aux" and flow.aux_rule and "compaction" in flow.aux_rule:
        summary = _reply_text(flow.reply.json if flow.reply is not None else None)
        if summary:
            chain.note_compaction(summary)


def count(flow: Flow, pending: PendingRecord, seq: int) -> None:
    metrics = flow.ctx.metrics
    if pending.status != "failed" and pending.metadata.get("straddled_sync"):
        metrics.straddled.inc()
    metrics.records.inc()
    metrics.calls.labels(pending.call_kind, pending.status).inc()
    error = pending.metadata.get("error")
    if error is not None:
        metrics.errors.labels(error["kind"]).inc()


def settle_ledger(flow: Flow, pending: PendingRecord, seq: int) -> None:
    if pending.status == "failed":
        flow.session.ledger.note_failed()
    elif pending.status == "invalid":
        flow.session.ledger.note_invalid()


def note_error(flow: Flow, pending: PendingRecord, seq: int) -> None:
    """``last_error`` is what failed a call; a close cancelling one is no failure."""
    error = pending.metadata.get("error")
    if error is not None and error["kind"] != "cancelled":
        flow.session.note_error({**error, "call_index": pending.call_index, "at": time.time()})


def remember_for_retries(flow: Flow, pending: PendingRecord, seq: int) -> None:
    """A retry of an answered call is answered from this record (``dedupe.py``); one that raised is sampled again."""
    if was_served(pending):
        flow.session.replay.remember(flow.digest, pending.call_index, flow.ctx.config.dedupe_window)


def commit_prompt_mode(flow: Flow, pending: PendingRecord, seq: int) -> None:
    """The prompt mode keeps this call's exact ids as its chain's checkpoint (incremental sessions)."""
    call, ev, reply = flow.mode_call, flow.evidence, flow.agent_reply
    if was_served(pending) and call is not None and ev is not None and reply is not None:
        mode_for(flow.session.spec.prompt_mode).committed(call, ev, reply)


HOOKS: tuple[AfterCommit, ...] = (place_in_chain, count, settle_ledger, note_error, remember_for_retries,
                                  commit_prompt_mode)


def after_commit(flow: Flow, pending: PendingRecord, seq: int) -> None:
    for hook in HOOKS:
        hook(flow, pending, seq)


def _reply_text(reply: dict[str, Any] | None) -> str | None:
    """The text of a chat reply's first choice (what a compaction call summarized the history to)."""
    choices = (reply or {}).get("choices")
    message = choices[0].get("message") if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
        else None
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) and content.strip() else None
