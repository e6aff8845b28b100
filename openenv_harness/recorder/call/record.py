"""The record step: one durable record of the call, before the agent gets its reply (D14).

Built (``pending.py``: what the call was, what the engine applied, which budget it spent, how the
prompt mode served it), with how an agent call's prompt relates to its chain's (``chain/fidelity.py``)
and, where it departs, why (``chain/drift_cause.py``); committed (``commit``); and only then
followed by what later calls see (the after-commit hooks). A call the engine failed or aborted is
recorded from the pipeline's funnel (``record_failure``), through the same builder, commit and hooks.

Why hooks after the commit: each changes what later calls see -- the chain's tips, the retry window,
the prompt mode's checkpoints, the session's counts -- so none may run for a record the store did not
take (the call then gives back its number and budget: ``_unnumber``). A hook reads the stored record
and the flow; which ones act depends on how the call ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.call.pending import failed_record, served_metadata, served_record, was_served
from openenv_harness.recorder.chain.drift_cause import turn_view
from openenv_harness.recorder.errors import AgentError, session_closed
from openenv_harness.recorder.session.restore import read_tip_prompts
from openenv_harness.recorder.store.base import PendingRecord, SessionSealed
from openenv_harness.recorder.validate import Evidence

#: one hook: the flow, its stored record and the record's seq
AfterCommit = Callable[[Flow, PendingRecord, int], None]


async def record(flow: Flow) -> None:
    ev = flow.evidence
    assert ev is not None
    md = served_metadata(flow, ev)
    await observe_chain(flow, md, ev)
    pending = served_record(flow, ev, md)
    await commit(flow, pending)
    flow.agent_reply = pending.response


async def record_failure(flow: Flow, error: AgentError, *, kind: str | None = None) -> None:
    """A call that reached the engine but got no usable answer (an aborted one with its partial ids)."""
    await commit(flow, failed_record(flow, error, kind))


async def commit(flow: Flow, pending: PendingRecord) -> None:
    """Make the record durable, then run the after-commit hooks (``HOOKS``, in order). If storage
    fails, the agent gets a retryable error, never a reply whose record might be lost (D14); the
    engine's sample is dropped with it, and no hook runs. A closed session's records are final: the
    store refuses the append (``RecordStore.seal``)."""
    try:
        seq = await flow.ctx.store.append(pending)
    except SessionSealed:
        flow.store_refused = True
        raise session_closed(flow.session.id, in_flight=True) from None
    except Exception as exc:
        flow.store_refused = True
        flow.ctx.metrics.errors.labels("store_unavailable").inc()
        _unnumber(flow, pending)
        raise AgentError(503, f"the recorder could not store this call ({type(exc).__name__}: {exc}); retry shortly",
                         type="server_error", code="store_unavailable",
                         headers={"retry-after": str(flow.ctx.config.retry_after_s)}) from None
    flow.stored = True
    for hook in HOOKS:
        hook(flow, pending, seq)


def _unnumber(flow: Flow, pending: PendingRecord) -> None:
    """Nothing was stored for this call: it gives its number back and counts against no budget.

    The number can go back only while no later call of the session has taken one; the one case
    where that is not so is two calls of one session whose journal writes overlap (under
    ``sqlite_synchronous=FULL`` the write waits for an fsync) and where the store fails the first
    and takes the second. Everything else is synchronous from numbering to journalling."""
    session = flow.session
    session.numbers.give_back(flow.call_index)
    flow.call_index = -1
    served = was_served(pending)  # counted as ``pending.py`` counted it
    session.ledger.refund(flow.call_kind, flow.evidence if served else None, served=served)


async def observe_chain(flow: Flow, md: dict[str, Any], ev: Evidence) -> None:
    """An agent call with its ids: its transition (``metadata.fidelity``), where it departs from its
    parent why (``drift_cause.py``), and its turn view, kept while it is a tip.

    The session's chain (under the recorder's span budget) classifies the call; a break against tips
    it sketched while the session was idle first reads those tips' prompts back (``chain/fidelity.py``)."""
    if flow.call_kind != "agent" or ev.prompt_ids is None or ev.completion_ids is None:
        return
    chain = flow.session.chain
    prompts: dict[str, bytes] = {}
    for _ in range(3):  # a concurrent call of the session may sketch or replace tips meanwhile
        need = {n: s for n, s in chain.prompts_needed(ev.prompt_ids).items() if n not in prompts}
        if not need:
            break
        prompts.update(await read_tip_prompts(flow.ctx.store, flow.session.id, need))
    transition = chain.observe(md["node_id"], ev.prompt_ids, ev.completion_ids, prompts)
    md["fidelity"] = transition.as_dict()
    if transition.fidelity != "root":
        flow.ctx.metrics.transitions.labels(transition.fidelity).inc()
    messages = flow.body.get("messages") or []
    if transition.fidelity in ("replay_drift", "break"):
        cause = chain.departure_cause(transition, messages, ev.prompt_ids, flow.ctx.engine_watch.certification)
        md["fidelity"]["cause"] = cause
        flow.ctx.metrics.transition_causes.labels(transition.fidelity, cause).inc()
    choices = flow.reply.json.get("choices") if flow.reply is not None and flow.reply.json else None
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    chain.keep_view(md["node_id"], turn_view(messages, message if isinstance(message, dict) else None,
                                             ev.completion_ids.tobytes()))


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
    """The call's outcome, counted in the recorder's metrics and the session's counters; a failure is
    also the session's ``last_error`` (a close cancelling a call is no failure)."""
    metrics, session = flow.ctx.metrics, flow.session
    if pending.status != "failed" and pending.metadata.get("straddled_sync"):
        metrics.straddled.inc()
    metrics.records.inc()
    metrics.calls.labels(pending.call_kind, pending.status).inc()
    if pending.status == "failed":
        session.ledger.note_failed()
    elif pending.status == "invalid":
        session.ledger.note_invalid()
    error = pending.metadata.get("error")
    if error is not None:
        metrics.errors.labels(error["kind"]).inc()
        if error["kind"] != "cancelled":
            session.note_error({**error, "call_index": pending.call_index, "at": time.time()})


def remember_for_retries(flow: Flow, pending: PendingRecord, seq: int) -> None:
    """A retry of an answered call is answered from this record (``call/admit.py: dedupe``); one that raised is sampled again."""
    if was_served(pending):
        flow.session.replay.remember(flow.digest, pending.call_index, flow.ctx.config.dedupe_window)


def commit_prompt_mode(flow: Flow, pending: PendingRecord, seq: int) -> None:
    """The prompt mode keeps this call's exact ids as its chain's checkpoint (incremental sessions)."""
    call, ev = flow.mode_call, flow.evidence
    if was_served(pending) and call is not None and ev is not None:  # the agent is sent ``pending.response``
        flow.session.prompt_mode.committed(call, ev, pending.response)


HOOKS: tuple[AfterCommit, ...] = (place_in_chain, count, remember_for_retries, commit_prompt_mode)


def _reply_text(reply: dict[str, Any] | None) -> str | None:
    """The text of a chat reply's first choice (what a compaction call summarized the history to)."""
    choices = (reply or {}).get("choices")
    message = choices[0].get("message") if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
        else None
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) and content.strip() else None
