"""One intercepted chat call, as an object passing through small named steps.

    authenticate → parse → classify → budget → dedupe → forward → validate → tool caps → record
    → reply

Each step is a function of the ``Flow``; reading them top to bottom follows one call from the
agent's request to the stored record and the bytes sent back. Agents that speak the Responses or the
Anthropic Messages API enter and leave through their dialect's adapter (``dialects/``); the steps
in between are the same for every agent. Errors are ``AgentError`` raised by
a step; once the engine has been called, even a failure is recorded before the agent hears of it.
The validate and record steps (what a record holds) live in ``record_step.py``.
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

from openenv_harness.recorder import budget, keepalive
from openenv_harness.recorder.auth import bearer_token, digests_match, secret_digest
from openenv_harness.recorder.classify import classify_call
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.engine_paused import send_through_pause
from openenv_harness.recorder.errors import AgentError, session_closed
from openenv_harness.recorder.prompt_mode import strategy_for
from openenv_harness.recorder.relay_errors import relay_upstream_error, relay_upstream_failure
from openenv_harness.recorder.request_body import check_body, not_json
from openenv_harness.recorder.restore import restore
from openenv_harness.recorder.sessions import LiveSession
from openenv_harness.recorder.sse import synthesize_sse
from openenv_harness.recorder.upstream.base import UpstreamFailure, UpstreamReply
from openenv_harness.recorder.upstream.reply_parse import PromptIdsReader
from openenv_harness.recorder.record_step import record, record_failure, validate
from openenv_harness.recorder.validate import Evidence

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from openenv_harness.recorder.dialects.base import Dialect

#: What the recorder adds to every upstream body -- and nothing else (D3). ``return_weight_versions``: from
#: vLLM 0.33 the chat route answers which weights sampled which tokens (spans per choice, recorded as
#: ``metadata.weight_versions``); 0.32 ignores the field, as it ignores every field it does not know.
_CAPTURE_FIELDS = {"return_token_ids": True, "logprobs": True, "stream": False, "return_weight_versions": True}


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
    #: what the prompt mode worked out for this call while in flight, which its commit reuses
    #: (``prompt_mode._Call``: the history's digests, the checkpoint continued, the prompt composed)
    prompt_mode_call: Any = None
    #: how long the call waited on an engine paused by someone else (``engine_paused.py``), if it did
    engine_paused: dict[str, Any] | None = None

    def cancel_for_close(self) -> None:
        """The session is closing and this call is still waiting (``SessionRegistry.close``)."""
        if self.cancellable and self.task is not None and not self.cancelled_by_close:
            self.cancelled_by_close = True
            self.task.cancel()


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
            strategy = strategy_for(flow.session.spec.prompt_mode)
            # an engine paused by someone else refuses new calls (vLLM 0.33+): held, not failed
            flow.reply = await send_through_pause(lambda: strategy.send(flow, upstream), ctx.config.pause_wait_s,
                                                  lambda wait: setattr(flow, "engine_paused", wait))
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
        flow.session.prompt_ids = PromptIdsReader(flow.ctx.span_budget)
    flow.prompt_ids = flow.session.prompt_ids.take(flow.reply)


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
    if session.closing:  # a close began on the admin listener's thread between the check above and now
        session.call_ended(flow)
        error = session_closed(session)
        return dialect.error(error) if dialect is not None else error.to_response()
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
