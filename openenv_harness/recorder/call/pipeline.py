"""One agent call through its named steps, and the one place its failures become answers.

    authenticate → enter → parse → enforce_budget → dedupe → forward → validate
    → tool_caps → record → reply

Each step is a function of the ``Flow``, in the module of its phase: ``admit.py`` (up to the engine),
``forward.py`` (the engine's sample), ``record.py`` (the durable record and what follows it) and
``reply`` here; reading ``serve`` top to bottom follows one call from the agent's request to the
stored record and the bytes sent back. A step
fails by raising: an ``AgentError`` for the agent (a refusal, an engine's error, a store that
cannot take the record), anything else a recorder bug; a step that finds a cap sets ``Flow.stop``
and ``serve`` stops the session (no step sees the registry). ``_funnel`` turns each failure into the answer, in
the dialect's error shape, and records the call as failed first when the engine was asked and no
record holds it -- so once the engine was called, even a failure is durable before the agent hears.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

from openenv_harness.recorder.call.admit import authenticate, dedupe, enforce_budget, enter, parse
from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.call.forward import apply_tool_caps, forward, validate
from openenv_harness.recorder.call.record import record, record_failure
from openenv_harness.recorder.call.services import CallEntry
from openenv_harness.recorder.dialects.base import Dialect
from openenv_harness.recorder.edge import keepalive
from openenv_harness.recorder.errors import AgentError, session_closed
from openenv_harness.recorder.session.registry import SessionRegistry
from openenv_harness.recorder.session.restore import restore

log = logging.getLogger(__name__)


async def handle_call(ctx: CallEntry, path_session: str | None, headers: Mapping[str, str], raw: bytes,
                      dialect: Dialect) -> Response:
    """An agent call's answer. A streaming call still running after the keepalive grace is answered
    with a stream that carries keepalives until its reply (``keepalive.py``)."""
    try:
        session = authenticate(ctx.sessions, path_session, headers)
    except AgentError as exc:
        return dialect.error(exc)
    flow = Flow(ctx=ctx, session=session, headers=headers, dialect=dialect, raw=raw)
    session.call_started(flow)
    if session.closing:  # a close began on the admin listener's thread between the check above and now
        session.call_ended(flow)
        return dialect.error(session_closed(session.id))
    grace = ctx.config.stream_keepalive_s
    if grace <= 0 or b'"stream"' not in raw:  # only a call that may stream can carry keepalives
        flow.task = asyncio.current_task()
        return await _serve_to_end(flow, ctx.sessions)
    flow.task = asyncio.ensure_future(_serve_to_end(flow, ctx.sessions))
    return await keepalive.answer(flow.task, streaming=lambda: flow.wants_stream, dialect=dialect,
                                  grace_s=grace, interval_s=grace)


async def _serve_to_end(flow: Flow, sessions: SessionRegistry) -> Response:
    try:
        return await serve(flow, sessions)
    finally:
        flow.session.call_ended(flow)


async def serve(flow: Flow, sessions: SessionRegistry) -> Response:
    """The steps after authentication. A retry of this call arriving meanwhile waits on its twin (a
    future holding this call's reply) instead of sampling again (``call/admit.py: dedupe``)."""
    ctx, session = flow.ctx, flow.session
    twin: asyncio.Future[Any] | None = None
    try:
        if session.restore_pending:  # recovered after a restart: its chain state comes from its records
            await restore(ctx.store, session, ctx.config.dedupe_window)
        enter(flow)
        parse(flow)
        enforce_budget(flow)  # a cap it finds is ``flow.stop``: applied below, before the refusal is answered
        if await dedupe(flow):
            ctx.metrics.replays.inc()
            session.ledger.note_replayed()
            return reply(flow)
        twin = session.replay.open_twin(flow.digest)
        await forward(flow)
        validate(flow)
        apply_tool_caps(flow)
        if flow.stop is not None:  # a tool cap stopped the session: before the record, so its ``limits.stop`` names it
            await sessions.stop(session, flow.stop)
        await record(flow)
    except BaseException as exc:
        if flow.stop is not None:  # a refusal whose cap stops the session: stopped before it is answered
            try:
                await sessions.stop(session, flow.stop)
            except Exception:  # the session is stopped in memory; the refusal still goes out
                log.error("recorder: could not persist session %s's stop (%s)", session.id, flow.stop, exc_info=True)
        try:
            error = await _funnel(flow, exc)
        except BaseException:
            _fail_twin(twin, RuntimeError("cancelled"))
            raise
        _fail_twin(twin, error)
        return flow.dialect.error(error)
    else:
        assert twin is not None
        twin.set_result(flow.agent_reply)
    finally:
        if twin is not None:
            session.replay.close_twin(flow.digest, twin)
    session.notify()
    response = reply(flow)
    elapsed = time.perf_counter() - flow.started
    ctx.metrics.latency.observe(elapsed)
    if flow.reply is not None:
        ctx.metrics.overhead.observe(max(0.0, elapsed - flow.reply.elapsed_ms / 1000.0))
    return response


def reply(flow: Flow) -> Response:
    """The recorded chat completion, in the agent's own API, built only after the record committed."""
    assert flow.agent_reply is not None
    return flow.dialect.render(flow.agent_reply, flow.dialect_call, flow.session.dialect_memory, stream=flow.wants_stream,
                               include_usage=flow.include_usage)


def _fail_twin(twin: asyncio.Future[Any] | None, error: Exception) -> None:
    if twin is not None and not twin.done():
        twin.set_exception(error)
        twin.exception()  # mark retrieved: nobody may be waiting on it


async def _funnel(flow: Flow, exc: BaseException) -> AgentError:
    """The error a failed call is answered with, recorded first where the engine was asked.

    - an ``AgentError``: as it is; recorded when the forward step marked it the engine's failure;
    - a close of the session cancelling the call: 409 ``session_closed``; recorded (as cancelled)
      when the engine had been asked;
    - anything else is a recorder bug: a 500 that names no internals (the traceback goes to the
      log), recorded as a failed, untrainable call when the engine had been asked.
    Any other cancellation is the server's, and propagates."""
    kind: str | None = None
    if isinstance(exc, AgentError):
        error, asked = exc, exc.engine_failure
    elif isinstance(exc, asyncio.CancelledError) and flow.cancelled_by_close:
        task = asyncio.current_task()
        assert task is not None
        task.uncancel()
        error, asked, kind = session_closed(flow.session.id, in_flight=True), flow.engine_asked, "cancelled"
    elif isinstance(exc, Exception):
        log.error("recorder: a chat call failed inside the recorder (session %s)", flow.session.id, exc_info=exc)
        error = AgentError(500, f"internal error in the recorder ({type(exc).__name__}); the call is recorded "
                           "as failed", type="server_error", code="recorder_error")
        asked = flow.engine_asked
    else:
        raise exc
    if asked and not flow.stored and not flow.store_refused:
        try:
            await record_failure(flow, error, kind=kind)
        except AgentError as refusal:  # the store could not take the failure's record either
            return refusal
    return error
