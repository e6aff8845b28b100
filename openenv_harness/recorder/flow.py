"""One intercepted chat call, as an object passing through small named steps.

    authenticate → parse → classify → budget → dedupe → forward → validate → tool caps → record
    → reply

Each step is a function of the ``Flow``; reading them top to bottom follows one call from the
agent's request to the stored record and the bytes sent back. Agents that speak the Responses or the
Anthropic Messages API enter and leave through their dialect's adapter (``dialects/``); the steps
in between are the same for every agent. Errors are ``AgentError`` raised by
a step; once the engine has been called, even a failure is recorded before the agent hears of it.
A session recovered after a restart first gets its chain state back from its records (``restore.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

import orjson
from starlette.responses import Response

from openenv_harness.contract import SCHEMA_VERSION
from openenv_harness.recorder import budget, keepalive
from openenv_harness.recorder.auth import bearer_token, digests_match, secret_digest
from openenv_harness.recorder.classify import classify_call
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.drift_cause import break_cause, drift_cause, turn_view
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.fidelity import FidelityTracker
from openenv_harness.recorder.prompt_mode import strategy_for
from openenv_harness.recorder.provenance import call_provenance
from openenv_harness.recorder.relay_errors import relay_upstream_error, relay_upstream_failure
from openenv_harness.recorder.request_body import check_body, not_json
from openenv_harness.recorder.restore import restore
from openenv_harness.recorder.sessions import LiveSession
from openenv_harness.recorder.sse import synthesize_sse
from openenv_harness.recorder.store.base import PendingRecord, SessionSealed
from openenv_harness.recorder.upstream.base import UpstreamFailure, UpstreamReply
from openenv_harness.recorder.upstream.reply_parse import PromptIdsReader
from openenv_harness.recorder.validate import Evidence, agent_view, extract_evidence

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from openenv_harness.recorder.dialects.base import Dialect

#: What the recorder adds to every upstream body -- and nothing else (D3).
_CAPTURE_FIELDS = {"return_token_ids": True, "logprobs": True, "stream": False}


@dataclass
class Flow:
    ctx: RecorderContext
    session: LiveSession
    headers: Mapping[str, str]
    raw: bytes
    received_at: float = field(default_factory=time.time)
    started: float = field(default_factory=time.perf_counter)
    body: dict[str, Any] = field(default_factory=dict)
    wants_stream: bool = False
    include_usage: bool = False
    keep_logprobs: bool = False
    call_kind: str = "agent"
    aux_rule: str | None = None
    digest: str = ""
    call_index: int = -1
    version_start: int = 0
    version_end: int = 0
    upstream_body: dict[str, Any] = field(default_factory=dict)
    reply: UpstreamReply | None = None
    prompt_ids: array | None = None
    evidence: Evidence | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    agent_reply: dict[str, Any] | None = None
    replayed: bool = False
    #: set when a tool-call cap cut the reply (``budget.cut_tool_calls``); kept in the record's metadata
    tool_limit: dict[str, Any] | None = None
    stored: bool = False
    #: the agent's API when it is not chat (``dialects/``): it translates at entry and at reply
    dialect: "Dialect | None" = None
    dialect_call: Any = None
    #: the task serving this call; a close may cancel it while ``cancellable`` (until the engine answered)
    task: asyncio.Task | None = None
    cancellable: bool = True
    cancelled_by_close: bool = False
    #: how the prompt mode served this call (incremental sessions): continued or fell back, and why
    prompt_mode: dict[str, Any] | None = None

    def cancel_for_close(self) -> None:
        """The session is closing and this call is still waiting (``SessionRegistry.close``)."""
        if self.cancellable and self.task is not None and not self.cancelled_by_close:
            self.cancelled_by_close = True
            self.task.cancel()


def session_closed(session: LiveSession, *, in_flight: bool = False) -> AgentError:
    message = (f"session {session.id} was closed while this call was in flight; it was not answered" if in_flight
               else f"session {session.id} is closed")
    return AgentError(409, message, type="invalid_request_error", code="session_closed")


# -- authenticate ------------------------------------------------------------------------------


def authenticate(ctx: RecorderContext, path_session: str | None, headers: Mapping[str, str]) -> LiveSession:
    """The bearer key is the session secret (D5). Unknown/missing/other session's key → 401."""
    key = bearer_token(headers)
    if not key:
        raise AgentError(401, "missing API key: send the session secret as a Bearer token", type="authentication_error")
    if path_session is not None:
        session = ctx.sessions.get(path_session)
        if session is None or not digests_match(session.secret_digest, key):
            raise AgentError(401, "invalid API key for this session", type="authentication_error")
    else:
        session = ctx.sessions.by_digest(secret_digest(key))
        if session is None:
            raise AgentError(401, "invalid API key", type="authentication_error")
    if session.status == "closed" or session.closing:
        raise session_closed(session)
    return session


# -- parse / classify --------------------------------------------------------------------------


def parse(flow: Flow) -> None:
    if len(flow.raw) > flow.ctx.config.max_body_bytes:
        raise AgentError(413, f"request body exceeds {flow.ctx.config.max_body_bytes} bytes", code="body_too_large")
    try:
        body = orjson.loads(flow.raw)
    except orjson.JSONDecodeError as exc:
        raise not_json(exc, flow.raw) from None
    if not isinstance(body, dict):
        raise AgentError(400, "request body must be a JSON object", code="invalid_body")
    check_body(body, flow.raw, flow.ctx.config.max_json_depth)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise AgentError(400, "'messages' must be a non-empty array", code="invalid_messages")
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        raise AgentError(400, "every message must be an object with a string 'role'", code="invalid_messages")
    n = body.get("n")
    if n is not None and (type(n) is not int or n != 1):  # not True, not 1.0: the integer one, or absent
        raise AgentError(400, "only n=1 is supported (one sample per call)", code="invalid_n")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise AgentError(400, "'tools' must be an array", code="invalid_tools")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise AgentError(400, "'stream' must be a boolean", code="invalid_stream")
    flow.body = body
    flow.wants_stream = stream
    options = body.get("stream_options")
    flow.include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    flow.keep_logprobs = body.get("logprobs") is True
    # An Idempotency-Key names the logical call even if a client re-encodes its body on retry.
    idem = flow.headers.get("idempotency-key")
    flow.digest = ("idem:" + hashlib.sha256(idem.encode()).hexdigest()) if idem else hashlib.sha256(flow.raw).hexdigest()


def classify(flow: Flow) -> None:
    rules = flow.session.spec.aux_rules
    flow.call_kind, flow.aux_rule = classify_call(flow.body, rules)


# -- dedupe ------------------------------------------------------------------------------------


async def dedupe(flow: Flow) -> bool:
    """A retried call (identical body in the same session) is answered from the record.

    Both CLIs resend byte-identical bodies on retry; sampling again would put a second, different
    answer in the trace for one agent turn. A replay is exactly what the first attempt was sent --
    from its in-flight twin, or from the stored record's ``response``, which keeps the logprobs
    when the call asked for them (``record``) -- so a retry under the same ``Idempotency-Key``
    whose body differs gets the logical call's one answer too. Returns True when replayed.
    """
    session = flow.session
    twin = session.inflight.get(flow.digest)
    if twin is not None:
        try:
            flow.agent_reply = await asyncio.shield(twin)
        except Exception:
            return False  # the twin failed: this retry gets a fresh attempt
        flow.replayed = flow.agent_reply is not None
        return flow.replayed
    if flow.ctx.config.dedupe_window and flow.digest in session.recent_digests:
        entry = await flow.ctx.store.find_by_digest(session.id, flow.digest)
        if entry is not None:
            flow.agent_reply = entry["response"]
            flow.replayed = True
            return True
    return False


# -- forward -----------------------------------------------------------------------------------


def upstream_body(body: dict[str, Any], sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """The agent's body verbatim plus the capture fields (``top_logprobs`` only if absent).

    ``sampling`` is what the trainer pinned for the session (applied over the agent's fields).
    """
    out = {k: v for k, v in body.items() if k != "stream_options"}
    if sampling:
        out.update(sampling)
        if "tool_choice" in sampling and not body.get("tools"):
            # a pinned tool choice applies to calls that offer tools; on one without (a title, a
            # summary) the engine would refuse the call instead
            if "tool_choice" in body:
                out["tool_choice"] = body["tool_choice"]
            else:
                del out["tool_choice"]
    out.update(_CAPTURE_FIELDS)
    out.setdefault("top_logprobs", 0)
    if out.get("top_logprobs") is None:
        out["top_logprobs"] = 0
    return out


async def forward(flow: Flow) -> None:
    ctx = flow.ctx
    upstream = ctx.upstream_for(flow.session.spec.upstream)
    if upstream is None:
        raise AgentError(503, "no engine is configured for this session", type="server_error", code="no_engine",
                         headers={"retry-after": str(ctx.config.retry_after_s)})
    if ctx.store.failure() is not None:  # its record could not be stored: no sample, no call number spent
        ctx.metrics.errors.labels("store_unavailable").inc()
        raise AgentError(503, "the recorder cannot store calls right now; retry shortly", type="server_error",
                         code="store_unavailable", headers={"retry-after": str(ctx.config.retry_after_s)})
    if not await ctx.fence.admit():
        ctx.metrics.rejected.labels("paused").inc()
        raise AgentError(503, "engine is paused for a weight update; retry shortly", type="server_error",
                         code="engine_paused", headers={"retry-after": str(ctx.config.retry_after_s)})
    flow.upstream_body = upstream_body(flow.body, flow.session.spec.sampling)
    if ctx.fence.served_model:
        flow.upstream_body["model"] = ctx.fence.served_model
    if flow.session.closing:  # a retry whose twin was cancelled by the close, or a call held at the fence
        raise session_closed(flow.session)
    flow.version_start = ctx.fence.version
    ctx.fence.inflight += 1
    try:
        try:
            # the session's prompt mode decides what the engine is asked to continue (prompt_mode.py)
            flow.reply = await strategy_for(flow.session.spec.prompt_mode).send(flow, upstream)
        finally:
            flow.cancellable = False  # the engine answered (or failed): from here on a close waits
            ctx.fence.inflight -= 1
    except UpstreamFailure as exc:
        flow.version_end = ctx.fence.version
        error = relay_upstream_failure(exc, ctx.config.retry_after_s)
        await record_failure(flow, error)
        raise error from None
    except asyncio.CancelledError:
        if not flow.cancelled_by_close:
            raise
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
        flow.version_end = ctx.fence.version
        error = session_closed(flow.session, in_flight=True)
        await record_failure(flow, error, kind="cancelled")
        raise error from None
    flow.version_end = ctx.fence.version
    ctx.metrics.upstream_latency.observe(flow.reply.elapsed_ms / 1000.0)
    read_prompt_ids(flow)
    if flow.reply.status != 200 or flow.reply.json is None:
        error = relay_upstream_error(flow.reply)
        await record_failure(flow, error)
        raise error


def read_prompt_ids(flow: Flow) -> None:
    """The reply's prompt ids, through the session's reader (which parses only what the previous
    prompt did not already hold; ``PromptIdsReader.take``)."""
    assert flow.reply is not None
    if flow.reply.prompt_span is None:
        return
    if flow.session.prompt_ids is None:
        flow.session.prompt_ids = PromptIdsReader()
    flow.prompt_ids = flow.session.prompt_ids.take(flow.reply)


# -- validate / record -------------------------------------------------------------------------


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
    return {
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
        if session.fidelity is None:
            session.fidelity = FidelityTracker()
        transition = session.fidelity.observe(md["node_id"], ev.prompt_ids, ev.completion_ids)
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
    await store_record(flow, pending)
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
            cause = "resample" if transition.drift_tokens == 0 else drift_cause(parent, messages, prompt, certification,
                                                                              transition.divergence_at)
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


async def store_record(flow: Flow, pending: PendingRecord) -> None:
    """Make the record durable. If storage fails, the agent gets a retryable error, never a reply
    whose record might be lost (D14); the engine's sample is dropped with it. A closed session's
    records are final: the store refuses the append (``RecordStore.seal``)."""
    try:
        await flow.ctx.store.append(pending)
    except SessionSealed:
        raise session_closed(flow.session, in_flight=True) from None
    except Exception as exc:  # noqa: BLE001 -- any storage failure means "not durable"
        flow.ctx.metrics.errors.labels("store_unavailable").inc()
        _unnumber(flow, pending)
        raise AgentError(503, f"the recorder could not store this call ({type(exc).__name__}: {exc}); retry shortly",
                         type="server_error", code="store_unavailable",
                         headers={"retry-after": str(flow.ctx.config.retry_after_s)}) from None
    flow.stored = True


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


# -- reply -------------------------------------------------------------------------------------


def reply(flow: Flow) -> Response:
    assert flow.agent_reply is not None
    if flow.dialect is not None:
        return flow.dialect.reply(flow)
    if flow.wants_stream:
        return Response(
            synthesize_sse(flow.agent_reply, include_usage=flow.include_usage),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache"},
        )
    return Response(orjson.dumps(flow.agent_reply), media_type="application/json")


# -- the whole call ------------------------------------------------------------------------------


async def serve_call(flow: Flow) -> None:
    """forward → validate → record. A failure inside the recorder on the way (a bug, not an engine
    or storage fault: those are ``AgentError``) may come after the engine was called, so it is
    recorded as a failed, untrainable call -- with its number, like any other -- and the agent gets
    a 500 that names no internals; the traceback goes to the recorder's log."""
    try:
        await forward(flow)
        validate(flow)
        cap = budget.cut_tool_calls(flow)
        if cap == "max_total_tool_calls":
            await budget.stop_for_tool_calls(flow, cap)
        await record(flow)
    except AgentError:
        raise
    except Exception as exc:  # noqa: BLE001 -- anything else is a recorder bug; see the docstring
        log.exception("recorder: a chat call failed inside the recorder (session %s)", flow.session.id)
        error = AgentError(500, f"internal error in the recorder ({type(exc).__name__}); the call is recorded "
                           "as failed", type="server_error", code="recorder_error")
        if not flow.stored:
            await record_failure(flow, error)
        raise error from None


async def handle_chat(ctx: RecorderContext, path_session: str | None, headers: Mapping[str, str], raw: bytes,
                      dialect: "Dialect | None" = None) -> Response:
    try:
        session = authenticate(ctx, path_session, headers)
    except AgentError as exc:
        return dialect.error(exc) if dialect is not None else exc.to_response()
    flow = Flow(ctx=ctx, session=session, headers=headers, raw=raw, dialect=dialect)
    session.call_started(flow)
    grace = ctx.config.stream_keepalive_s
    if grace <= 0 or b'"stream"' not in raw:  # only a call that may stream can carry keepalives
        flow.task = asyncio.current_task()
        return await _serve_to_end(flow)
    flow.task = asyncio.ensure_future(_serve_to_end(flow))
    return await keepalive.answer(flow.task, streaming=lambda: flow.wants_stream, dialect=dialect,
                                  grace_s=grace, interval_s=grace)


async def _serve_to_end(flow: Flow) -> Response:
    """The call's steps; a close that cancels it while it waits answers it as closed."""
    session, dialect = flow.session, flow.dialect
    try:
        return await _serve(flow)
    except asyncio.CancelledError:
        if not flow.cancelled_by_close:
            raise
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
        error = session_closed(session, in_flight=True)  # it never reached the engine
        return dialect.error(error) if dialect is not None else error.to_response()
    finally:
        session.call_ended(flow)


async def _serve(flow: Flow) -> Response:
    ctx, session, started, dialect = flow.ctx, flow.session, flow.started, flow.dialect
    try:
        if session.restore_pending:  # recovered after a restart: its chain state comes from its records
            await restore(ctx.store, session)
        if dialect is not None:
            dialect.enter(flow)  # the agent's Responses/Messages body becomes the chat body parsed next
        parse(flow)
        classify(flow)
        await budget.enforce(flow)
        if await dedupe(flow):
            ctx.metrics.replays.inc()
            session.counters.replayed_calls += 1
            return reply(flow)
        twin: asyncio.Future = asyncio.get_running_loop().create_future()
        session.inflight[flow.digest] = twin
        try:
            await serve_call(flow)
            twin.set_result(flow.agent_reply)
        except BaseException as exc:
            if not twin.done():
                twin.set_exception(exc if isinstance(exc, Exception) else RuntimeError("cancelled"))
                twin.exception()  # mark retrieved: nobody may be waiting on it
            raise
        finally:
            if session.inflight.get(flow.digest) is twin:
                del session.inflight[flow.digest]
        session.notify()
        response = reply(flow)
        elapsed = time.perf_counter() - started
        ctx.metrics.latency.observe(elapsed)
        if flow.reply is not None:
            ctx.metrics.overhead.observe(max(0.0, elapsed - flow.reply.elapsed_ms / 1000.0))
        return response
    except AgentError as exc:
        return dialect.error(exc) if dialect is not None else exc.to_response()
