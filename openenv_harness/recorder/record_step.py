"""The flow's validate and record steps: the engine's reply becomes evidence, then one durable record.

``validate`` reads the token evidence out of the engine's reply; ``record`` builds the record's
metadata (call number, provenance, budgets, fidelity and its cause) and hands it to the store, and
returns only once it is durable -- the agent's reply is built after. A call that fails once the
engine was called is recorded too (``record_failure``), untrainable, before the agent hears of it.
Split from ``flow.py`` so that file reads as the call's path, and this one as what a record holds.
"""

from __future__ import annotations

import time
from array import array
from typing import TYPE_CHECKING, Any

from openenv_harness.contract import SCHEMA_VERSION
from openenv_harness.recorder import budget
from openenv_harness.recorder.drift_cause import break_cause, drift_cause, turn_view
from openenv_harness.recorder.errors import AgentError, session_closed
from openenv_harness.recorder.fidelity import FidelityTracker, Transition
from openenv_harness.recorder.prompt_mode import strategy_for
from openenv_harness.recorder.provenance import call_provenance
from openenv_harness.recorder.restore import read_tip_prompts
from openenv_harness.recorder.store.base import PendingRecord, SessionSealed
from openenv_harness.recorder.validate import Evidence, agent_view, extract_evidence

if TYPE_CHECKING:
    from openenv_harness.recorder.flow import Flow


def validate(flow: Flow) -> None:
    assert flow.reply is not None and flow.reply.json is not None
    flow.evidence = extract_evidence(flow.reply.json, flow.prompt_ids)
    flow.evidence.reasons.extend(flow.reply.doubts)


def _base_metadata(flow: Flow, status: str, trainable: bool) -> dict[str, Any]:
    """The metadata every record has. The call gets its number here, when its record is built: a call
    that ends without a record (refused, or unstorable: ``store_record`` gives the number back)
    uses none, so a session's call numbers are its records' positions, with no gap."""
    session = flow.session
    if flow.call_index < 0:
        flow.call_index = session.take_call_index()
    md = {
        "schema_version": SCHEMA_VERSION,
        "node_id": f"{session.id}/{flow.call_index}",
        "session_id": session.id,
        "call_index": flow.call_index,
        "call_kind": flow.call_kind,
        "aux_rule": flow.aux_rule,
        "status": status,
        "trainable": trainable,
        "stream": flow.wants_stream,
        "policy_version_start": flow.version_start,
        "policy_version_end": flow.version_end,
        "straddled_sync": flow.version_start != flow.version_end,
        "request_digest": flow.digest,
        "harness_session_id": flow.headers.get(flow.dialect.session_header if flow.dialect else "x-session-id"),
        "dialect": flow.dialect.name if flow.dialect is not None else "chat",
        "received_at": flow.received_at,
        "upstream_ms": flow.reply.elapsed_ms if flow.reply is not None else None,
        "provenance": call_provenance(flow.ctx, session, flow.upstream_body or flow.body, flow.body,
                                      flow.reply.headers if flow.reply is not None else None),
    }
    if flow.engine_paused is not None:
        md["engine_paused"] = flow.engine_paused
    return md


async def record(flow: Flow) -> None:
    ev = flow.evidence
    assert ev is not None and flow.reply is not None and flow.reply.json is not None
    session = flow.session
    aborted = ev.finish_reason == "abort"
    if aborted:  # a pause in abort mode, or the engine's own abort: the sample stopped part-way
        ev.reasons.append("engine aborted the call (finish_reason=abort): a partial sample, kept for inspection")
    trainable = ev.valid and flow.call_kind == "agent"
    status = "ok" if ev.valid else "invalid"
    md = _base_metadata(flow, status, trainable)
    md["invalid_reasons"] = list(ev.reasons)
    md["finish_reason"] = ev.finish_reason
    md["usage"] = ev.usage
    md["partial"] = aborted
    constraint = md["provenance"]["decoding_constraint"]
    # under a decoding constraint the engine's logprobs are taken after its mask: a trainer must
    # exclude or correct these calls' logprobs (the sampled ids are still what was sampled)
    md["logprobs_are_policy"] = constraint is None
    weight_versions = _weight_versions(flow.reply.json)
    if weight_versions is not None:
        md["weight_versions"] = weight_versions
    if flow.tool_limit is not None:
        md["tool_limit"] = flow.tool_limit
    if session.spec.prompt_mode != "full_history":
        md["prompt_mode"] = flow.prompt_mode or {"mode": session.spec.prompt_mode, "continued": False,
                                                 "reason": "not_attempted"}
    if md["straddled_sync"]:
        flow.ctx.metrics.straddled.inc()
    if aborted:
        await _record_aborted(flow, ev, md, status)
        return
    if flow.call_kind == "agent" and ev.prompt_ids is not None and ev.completion_ids is not None:
        transition = await _observe_fidelity(flow, md["node_id"], ev.prompt_ids, ev.completion_ids)
        md["fidelity"] = transition.as_dict()
        if transition.fidelity != "root":
            flow.ctx.metrics.transitions.labels(transition.fidelity).inc()
        observe_cause(flow, md, transition, ev)
    elif flow.call_kind == "aux" and flow.aux_rule and "compaction" in flow.aux_rule:
        summary = _reply_text(flow.reply.json)
        if summary:
            session.compaction_summaries.append(summary)
    budget.account(session, flow.call_kind, ev, served=True)
    md["limits"] = budget.limits_state(session)
    flow.metadata = md
    # what the agent is sent, logprobs included when it asked: a replayed retry is answered with it
    response = agent_view(flow.reply.json, keep_logprobs=flow.keep_logprobs)
    if flow.dialect is not None:
        flow.dialect.keep_sampled_arguments(flow, response, md)
    pending = PendingRecord(
        session_id=session.id,
        call_index=flow.call_index,
        call_kind=flow.call_kind,
        status=status,
        request=flow.body,
        request_json=flow.raw,
        response=response,
        prompt_ids=ev.prompt_ids,
        completion_ids=ev.completion_ids,
        logprobs=ev.logprobs,
        completion_tokens=ev.completion_tokens,
        trainable=trainable,
        metadata=md,
        created_at=time.time(),
    )
    seq = await store_record(flow, pending)
    if session.fidelity is not None and "fidelity" in md:
        session.fidelity.placed(md["node_id"], seq)  # its prompt can be read back from here on
    flow.ctx.metrics.records.inc()
    flow.ctx.metrics.calls.labels(flow.call_kind, status).inc()
    if not ev.valid:
        session.counters.invalid_calls += 1
    recent = session.recent_digests
    recent[flow.digest] = flow.call_index
    while len(recent) > flow.ctx.config.dedupe_window:
        recent.popitem(last=False)
    flow.agent_reply = response
    strategy_for(session.spec.prompt_mode).committed(flow)


def observe_cause(flow: Flow, md: dict[str, Any], transition: Any, ev: Evidence) -> None:
    """Name why a drifting or breaking call departs from its parent, and keep this call's view."""
    session = flow.session
    views = session.turn_views
    messages = flow.body.get("messages") or []
    if transition.fidelity in ("replay_drift", "break"):
        parent = views.get(transition.parent)
        prompt = ev.prompt_ids.tobytes()
        certification = flow.ctx.engine_watch.certification if flow.ctx.engine_watch else None
        if parent is None:
            cause = "unknown"
        elif transition.fidelity == "replay_drift":
            cause = "resample" if transition.drift_tokens == 0 else drift_cause(
                parent, messages, prompt, certification, transition.divergence_at, session.compaction_summaries)
        else:
            cause = break_cause(parent, messages, same_prompt=False, summaries=session.compaction_summaries,
                                certification=certification)
        md["fidelity"]["cause"] = cause
        flow.ctx.metrics.transition_causes.labels(transition.fidelity, cause).inc()
    choices = flow.reply.json.get("choices") if flow.reply is not None and flow.reply.json else None
    message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
    views[md["node_id"]] = turn_view(messages, message if isinstance(message, dict) else None,
                                          ev.completion_ids.tobytes())
    tips = {t.node_id for t in session.fidelity.tips} if session.fidelity is not None else set()
    for node in [n for n in views if n not in tips]:
        del views[node]


def _reply_text(reply: dict[str, Any] | None) -> str | None:
    """The text of a chat reply's first choice (what a compaction call summarized the history to)."""
    choices = (reply or {}).get("choices")
    message = choices[0].get("message") if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
        else None
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) and content.strip() else None


def _weight_versions(reply: dict[str, Any]) -> Any:
    """Per-token weight versions when the engine reports them (vLLM 0.33 ``return_weight_versions``:
    ``choices[0].weight_versions = [{version, start, end}]``); None when it does not."""
    choices = reply.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0].get("weight_versions")
    return None


async def _record_aborted(flow: Flow, ev: Evidence, md: dict[str, Any], status: str) -> None:
    """Keep an aborted call's partial ids (untrainable), then tell the agent to retry the whole call.

    Why an error and not the partial answer: handed over, a cut-off reply becomes the agent's next
    history -- a turn the policy never finished. A retryable 503 makes the harness send the call
    again; that retry is not answered from this record (dedupe skips calls that raised)."""
    session = flow.session
    budget.account(session, flow.call_kind, None, served=False)
    md["limits"] = budget.limits_state(session)
    md["error"] = {"kind": "engine_aborted", "status": 503, "upstream_status": flow.reply.status if flow.reply else None,
                   "message": "the engine aborted the call part-way (finish_reason=abort)", "upstream_body": None}
    flow.metadata = md
    pending = PendingRecord(
        session_id=session.id, call_index=flow.call_index, call_kind=flow.call_kind, status=status,
        request=flow.body, request_json=flow.raw,
        response=agent_view(flow.reply.json, keep_logprobs=False) if flow.reply and flow.reply.json else {},
        prompt_ids=ev.prompt_ids, completion_ids=ev.completion_ids, logprobs=ev.logprobs,
        completion_tokens=ev.completion_tokens, trainable=False, metadata=md, created_at=time.time(),
    )
    await store_record(flow, pending)
    session.counters.invalid_calls += 1
    session.note_error({**md["error"], "call_index": flow.call_index, "at": time.time()})
    flow.ctx.metrics.records.inc()
    flow.ctx.metrics.calls.labels(flow.call_kind, status).inc()
    flow.ctx.metrics.errors.labels("engine_aborted").inc()
    raise AgentError(503, "the engine aborted this call part-way (a weight update or an engine abort); "
                     "retry the call", type="server_error", code="engine_aborted",
                     headers={"retry-after": str(flow.ctx.config.retry_after_s)})


async def _observe_fidelity(flow: Flow, node_id: str, prompt: array, completion: array) -> Transition:
    """The session's tracker (under the recorder's budget) classifies the call; a break against tips
    it sketched while the session was idle first reads those tips' prompts back (``fidelity.py``)."""
    session = flow.session
    if session.fidelity is None:
        session.fidelity = FidelityTracker(budget=flow.ctx.span_budget)
    elif session.fidelity.budget is None:  # rebuilt after a restart
        session.fidelity.budget = flow.ctx.span_budget
    prompts: dict[str, bytes] = {}
    for _ in range(3):  # a concurrent call of the session may sketch or replace tips meanwhile
        need = {n: s for n, s in session.fidelity.prompts_needed(prompt).items() if n not in prompts}
        if not need:
            break
        prompts.update(await read_tip_prompts(flow.ctx.store, session.id, need))
    return session.fidelity.observe(node_id, prompt, completion, prompts)


async def store_record(flow: Flow, pending: PendingRecord) -> int:
    """Make the record durable. If storage fails, the agent gets a retryable error, never a reply
    whose record might be lost (D14); the engine's sample is dropped with it. A closed session's
    records are final: the store refuses the append (``RecordStore.seal``)."""
    try:
        seq = await flow.ctx.store.append(pending)
    except SessionSealed:
        raise session_closed(flow.session, in_flight=True) from None
    except Exception as exc:  # noqa: BLE001 -- any storage failure means "not durable"
        flow.ctx.metrics.errors.labels("store_unavailable").inc()
        _unnumber(flow, pending)
        raise AgentError(503, f"the recorder could not store this call ({type(exc).__name__}: {exc}); retry shortly",
                         type="server_error", code="store_unavailable",
                         headers={"retry-after": str(flow.ctx.config.retry_after_s)}) from None
    flow.stored = True
    return seq


def _unnumber(flow: Flow, pending: PendingRecord) -> None:
    """Nothing was stored for this call: it gives its number back and counts against no budget.

    The number can go back only while no later call of the session has taken one; the one case
    where that is not so is two calls of one session whose journal writes overlap (under
    ``sqlite_synchronous=FULL`` the write waits for an fsync) and where the store fails the first
    and takes the second. Everything else is synchronous from numbering to journalling."""
    session = flow.session
    if session.next_call_index == flow.call_index + 1:
        session.next_call_index = flow.call_index
    flow.call_index = -1
    served = pending.status != "failed"
    budget.refund(session, flow.call_kind, flow.evidence if served else None, served=served)


async def record_failure(flow: Flow, error: AgentError, *, kind: str | None = None) -> None:
    """A call that reached the engine but got no usable answer: kept with the original error."""
    session = flow.session
    md = _base_metadata(flow, "failed", False)
    md["error"] = {
        "kind": kind or error.code or "upstream",
        "status": error.status,
        "upstream_status": flow.reply.status if flow.reply is not None else None,
        "message": error.message,
        "upstream_body": error.upstream_body,
    }
    if flow.prompt_mode is not None:  # incremental: which step of the continuation failed
        md["prompt_mode"] = flow.prompt_mode
    budget.account(session, flow.call_kind, None, served=False)
    md["limits"] = budget.limits_state(session)
    pending = PendingRecord(
        session_id=session.id, call_index=flow.call_index, call_kind=flow.call_kind, status="failed",
        request=flow.body, response={}, prompt_ids=None, completion_ids=None, logprobs=None,
        completion_tokens=None, trainable=False, metadata=md, created_at=time.time(),
    )
    await store_record(flow, pending)
    session.counters.failed_calls += 1
    if kind != "cancelled":  # ``last_error`` is what failed a call; a close cancelling one is no failure
        session.note_error({**md["error"], "call_index": flow.call_index, "at": time.time()})
    flow.ctx.metrics.records.inc()
    flow.ctx.metrics.calls.labels(flow.call_kind, "failed").inc()
    flow.ctx.metrics.errors.labels(md["error"]["kind"]).inc()
