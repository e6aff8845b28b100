"""Agent calls, in every dialect, answered straight from uvicorn's HTTP parser, without an ASGI request cycle.

Why: the agent routes are the recorder's only hot path, and under uvicorn each call also paid for an
ASGI scope, a request cycle with its event, a copy of the body, the proxy-headers middleware, a
Starlette response object and two socket writes (status and headers, then the body) -- about a
third of the event loop's samples at one 8k-token session (``docs/benchmarks.md``). Here the
parser's callbacks collect the body, ``call.pipeline.handle_call`` runs the call, and the reply leaves in
one write.

Everything else stays uvicorn's: the admin API, the viewer, ``/v1/models``, lifespan, WebSockets,
keep-alive timeouts, graceful shutdown. An agent call takes this path only when nothing about it
is unusual -- POST to an agent route, no upgrade, no ``Expect: 100-continue``, no root path or
concurrency limit configured, no earlier request on the connection still being answered
(pipelining) -- and otherwise goes through uvicorn into the app's ASGI agent entry, which runs the
same flow. Both paths give the same answers; the tests run the recorder through this one.

The protocol also bounds every request on every route, chat or not, as its bytes arrive
(``request_limits.py``): the head's size is counted before the parser sees it (the parser would
otherwise accumulate a header of any size), its header count once it is parsed, and timers bound the
time a head and a body take to arrive. A refusal goes out after any reply still owed on the
connection, and the connection then lingers, discarding, long enough for the client to read it.

Coupling: this subclasses uvicorn's ``HttpToolsProtocol`` and uses a few of its attributes.
``agent_protocol_class`` checks them and returns None (plain uvicorn) when they are missing, and
each connection checks its own instance, so a uvicorn release that changes them costs speed, not
correctness.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from openenv_harness.http1 import STATUS_LINES, chunk, fast_path, response_head, status_line
from openenv_harness.recorder.call.pipeline import handle_call
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.dialects.base import Dialect
from openenv_harness.recorder.dialects.routes import agent_target
from openenv_harness.recorder.edge.keepalive import keepalive_body
from openenv_harness.recorder.edge.request_limits import (
    RequestLimits,
    check_head,
    head_too_large,
    raw_response,
    request_timeout,
)
from openenv_harness.recorder.errors import AgentError, body_too_large

log = logging.getLogger(__name__)

try:  # uvicorn[standard] brings httptools; without it uvicorn serves with h11 and nothing here applies
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover -- httptools is a dependency of this package
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

#: What this module uses of uvicorn's protocol: its methods, and attributes each instance must have.
_METHODS = ("data_received", "send_400_response", "on_message_begin", "on_headers_complete", "on_body", "on_message_complete",
            "on_response_complete", "connection_made", "connection_lost", "shutdown")
_ATTRIBUTES = ("parser", "headers", "transport", "tasks", "cycle", "server_state", "loop", "config",
               "expect_100_continue", "access_log", "access_logger", "client", "flow", "pipeline")
#: After a refusal the connection discards what still arrives for this long (or this many bytes),
#: so that closing it does not reset it before the client has read the answer.
_LINGER_S = 2.0
_LINGER_BYTES = 4 * 1024 * 1024

class _NoEvent:
    """uvicorn sets its cycle's event when the connection goes; an answering call waits on nothing."""

    def set(self) -> None:
        pass


_NO_EVENT = _NoEvent()


@dataclass(slots=True, eq=False)
class _Answering:
    """Stands in for uvicorn's request cycle while a chat call is answered: uvicorn's own code reads
    these when the connection is lost (``disconnected``), on shutdown (``keep_alive``) and when a
    pipelined request arrives behind this one (``response_complete``: it is queued until then)."""

    keep_alive: bool
    response_complete: bool = False
    disconnected: bool = False
    message_event: _NoEvent = _NO_EVENT


@dataclass(slots=True, eq=False)
class _ChatRequest:
    """A chat request being read: its route, headers and body so far."""

    session_id: str | None
    dialect: Dialect
    headers: list[tuple[bytes, bytes]]
    keep_alive: bool
    limit: int
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    too_large: bool = False
    #: refused from its head (a declared body over the limit) before its body came
    answered: bool = False

    def add(self, chunk: bytes) -> None:
        if self.too_large:
            return  # read and dropped: the connection stays usable after the 413
        self.size += len(chunk)
        if self.size > self.limit:
            self.too_large, self.chunks = True, []
        else:
            self.chunks.append(chunk)


if HttpToolsProtocol is not None:

    class AgentCallProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol, with every request bounded and agent chat calls answered
        without ASGI."""

        def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any], _loop: Any = None) -> None:
            super().__init__(config, server_state, app_state, _loop)
            # an app carrying a recorder (``app.RecorderApp``) has its agent calls answered here
            recorder: RecorderContext | None = getattr(config.app, "recorder_context", None)
            usable = (recorder is not None and not config.root_path and config.limit_concurrency is None
                      and all(hasattr(self, name) for name in _ATTRIBUTES))
            self._recorder: RecorderContext | None = recorder if usable else None
            self._chat: _ChatRequest | None = None
            self._limits = RequestLimits.of(recorder.config if recorder is not None else None)
            self._in_head = True  # reading a request's head, or waiting for the next one
            self._head_bytes = 0  # of the head being read, on the wire
            self._started = False  # a byte of the current request has arrived
            self._timer: asyncio.TimerHandle | None = None
            self._refused = False  # answered with a refusal: the rest of the connection is discarded
            self._owed: AgentError | None = None  # a refusal waiting for the replies owed before it
            self._replying: list[Any] = []  # this connection's request cycles whose replies are not all out
            self._discarded = 0

        # -- bounds: head size before parsing, count once parsed, time to arrive --------------------

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm(self._limits.head_timeout_s)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                self._discard(len(data))
                return
            limit = self._limits.max_header_bytes
            rest: bytes | memoryview = data
            while rest:
                piece: bytes | memoryview
                if self._in_head:
                    room = limit - self._head_bytes
                    if room <= 0:
                        self._refuse(head_too_large(limit))
                        return
                    if len(rest) > room:  # feed only what the head may still take
                        view = memoryview(rest)
                        piece, rest = view[:room], view[room:]
                    else:
                        piece, rest = rest, b""
                    self._head_bytes += len(piece)
                else:
                    piece, rest = rest, b""
                super().data_received(piece)  # type: ignore[arg-type]  # the parser takes a memoryview too
                if self._refused or self.parser is None or self.transport.is_closing():
                    return
                if self.transport.get_protocol() is not self:  # upgraded (WebSocket): no longer ours
                    self._disarm()
                    return

        def on_message_begin(self) -> None:
            if self._refused:
                return
            super().on_message_begin()
            self._started = True
            if self._timer is None:  # the first request's head is timed from the connection's start
                self._arm(self._limits.head_timeout_s)

        def _admit_head(self) -> bool:
            """At the end of a head: its count and size checked, the body's timer armed."""
            self._in_head = False
            self._disarm()
            refusal = check_head(self.parser.get_method(), len(self.url), self.headers, self._limits)
            if refusal is not None:
                self._refuse(refusal)
                return False
            self._arm(self._limits.body_timeout_s)
            return True

        def _end_message(self) -> None:
            self._disarm()
            self._in_head, self._head_bytes, self._started = True, 0, False

        def _arm(self, seconds: float) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._timed_out, seconds)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _timed_out(self, seconds: float) -> None:
            self._timer = None
            if self._refused or self.transport is None or self.transport.is_closing():
                return
            if self.flow is not None and self.flow.read_paused:  # we stopped reading, not the client
                self._arm(seconds)
                return
            if self._in_head:
                if not self._started:
                    self.transport.close()  # never sent a byte of a request: nothing to answer
                else:
                    self._refuse(request_timeout("head", seconds))
                return
            chat, cycle = self._chat, self.cycle
            if chat is not None:
                if chat.answered:  # refused from its head already: all that is left is to stop reading
                    self.transport.close()
                    return
            elif cycle is not None:
                if cycle.response_complete or getattr(cycle, "response_started", False):
                    self.transport.close()  # the app has answered (or begun to) without the whole body
                    return
                cycle.disconnected = True  # the app waiting on the body hears a disconnect, and its
                cycle.message_event.set()  # reply (if any) is dropped: this connection answers 408
            self._send_refusal(request_timeout("body", seconds))

        def _refuse(self, error: AgentError) -> None:
            """Answer ``error`` and close, after any reply still owed on this connection."""
            self._refused = True
            self._disarm()
            if self._owing():
                self._owed = error  # sent by on_response_complete once the replies before it are out
                self.flow.pause_reading()
            else:
                self._send_refusal(error)

        def _send_refusal(self, error: AgentError) -> None:
            self._refused = True
            self._owed = None
            self.transport.write(raw_response(error, self.server_state.default_headers))
            if self.access_log:
                self.access_logger.info("%s - refused: %d", self.client and self.client[0], error.status)
            if self.transport.can_write_eof():
                self.transport.write_eof()  # the client reads the answer, then sees the end
                self._timer = self.loop.call_later(_LINGER_S, self.transport.close)
                self.flow.resume_reading()
            else:
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
            """What uvicorn answers a request the parser rejects (bad request line, header or framing):
            here in the OpenAI shape, after any reply still owed, and with the lingering close."""
            error = AgentError(400, "invalid HTTP request: its request line, headers or framing could not be parsed",
                               code="invalid_http")
            cycle = self.cycle
            if self._in_head or self._chat is not None or cycle is None:
                self._refuse(error)  # no reply has begun for this request; any owed before it go first
                return
            queued = [entry for entry in self.pipeline if entry[0] is cycle]
            if queued:  # its body broke while it waited its turn: it never runs, the refusal takes its place
                self.pipeline.remove(queued[0])
                cycle.response_complete = True
                self._refuse(error)
            elif cycle.response_complete or getattr(cycle, "response_started", False):
                self._refused = True
                self.transport.close()  # the app has answered (or begun to): nothing clear is left to say
            else:
                cycle.disconnected = True  # the app reading this body hears a disconnect; this answers
                cycle.message_event.set()
                self._send_refusal(error)

        def _discard(self, size: int) -> None:
            if self._owed is not None:  # replies are still owed: read no more until they are out
                self.flow.pause_reading()
                return
            self._discarded += size
            if self._discarded > _LINGER_BYTES and not self.transport.is_closing():
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            owing = self._owing()  # also forgets the cycles whose replies are out
            owed = self._owed
            if owed is not None and not owing and not self.transport.is_closing():
                self._send_refusal(owed)

        def _owing(self) -> bool:
            """Whether a reply to an earlier request on this connection is still to go out."""
            self._replying = [cycle for cycle in self._replying if not cycle.response_complete]
            return bool(self._replying)

        # -- parser callbacks: a chat request is collected here, anything else is uvicorn's -----------

        def on_headers_complete(self) -> None:
            if self._refused or not self._admit_head():
                return
            self._chat = self._chat_request()
            if self._chat is None:
                before = self.cycle
                super().on_headers_complete()
                if self.cycle is not before and self.cycle is not None:
                    self._replying.append(self.cycle)
            elif self._chat.too_large:  # declared over the limit: refused now, its body read and dropped
                self._answer_at_once(self._chat)

        def on_body(self, body: bytes) -> None:
            if self._refused:
                return
            if self._chat is not None:
                self._chat.add(body)
            else:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if self._refused:
                return
            self._end_message()
            request, self._chat = self._chat, None
            if request is None:
                super().on_message_complete()
                return
            if request.answered:
                self.on_response_complete()  # its reply is out: the connection takes the next request
                return
            cycle = _Answering(request.keep_alive)
            self.cycle = cycle  # type: ignore[assignment]
            self._replying.append(cycle)
            task = self.loop.create_task(self._answer(request, cycle))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)

        def _chat_request(self) -> _ChatRequest | None:
            recorder, parser = self._recorder, self.parser
            if recorder is None:
                return None
            target = fast_path(self)
            if target is None:
                return None
            path = target[1]
            found = agent_target(path)
            if found is None:
                return None
            session_id, dialect = found
            keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
            request = _ChatRequest(session_id, dialect, self.headers, keep_alive,
                                   recorder.config.max_body_bytes)
            for name, value in self.headers:
                if name == b"content-length" and value.isdigit() and int(value) > request.limit:
                    request.too_large = True
            return request

        # -- answering -------------------------------------------------------------------------------

        def _answer_at_once(self, request: _ChatRequest) -> None:
            """413 from the head alone: a client that declared a body over the limit hears it now, not
            once it has sent (or failed to send) that body."""
            request.answered = True
            if not request.keep_alive:  # the body will not be read: refuse and linger, as for a bad head
                self._send_refusal(body_too_large(request.limit))
                return
            cycle = _Answering(request.keep_alive)
            self.cycle = cycle  # type: ignore[assignment]
            error = body_too_large(request.limit)  # in the agent's own API's error shape
            self._write(request.dialect.error(error), cycle)

        async def _answer(self, request: _ChatRequest, cycle: _Answering) -> None:
            ctx = self._recorder
            assert ctx is not None
            try:
                if request.too_large:
                    error = body_too_large(request.limit)
                    response = request.dialect.error(error)
                else:
                    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in request.headers}
                    response = await handle_call(ctx, request.session_id, headers, b"".join(request.chunks),
                                                 request.dialect)
            except Exception:
                log.exception("recorder: a chat call failed unexpectedly")
                response = AgentError(500, "internal error in the recorder", type="server_error").to_response()
                cycle.keep_alive = False
            if cycle.disconnected or self.transport.is_closing():
                return  # the agent hung up; the call was still recorded (or failed) as usual
            events = keepalive_body(response)
            if events is not None:
                await self._write_stream(response, events, cycle)
            else:
                self._write(response, cycle)
            self.on_response_complete()

        async def _write_stream(self, response: Any, events: Any, cycle: _Answering) -> None:
            """A reply committed before its call finished (``keepalive.py``): the head now, then each
            event as an HTTP/1.1 chunk as it comes; nothing more once the agent has hung up."""
            out = [STATUS_LINES.get(response.status_code) or status_line(response.status_code)]
            for name, value in (*self.server_state.default_headers, *response.raw_headers):
                out += [name, b": ", value, b"\r\n"]
            out.append(b"transfer-encoding: chunked\r\n")
            if not cycle.keep_alive:
                out.append(b"connection: close\r\n")
            self.transport.write(b"".join(out) + b"\r\n")
            async for event in events:
                if cycle.disconnected or self.transport.is_closing():
                    continue  # drain: the call finishes and is recorded whether or not anyone listens
                if event:
                    self.transport.write(chunk(event))
            if not (cycle.disconnected or self.transport.is_closing()):
                self.transport.write(chunk(b"", last=True))
            cycle.response_complete = True
            if not cycle.keep_alive:
                self.transport.close()

        def _write(self, response: Any, cycle: _Answering) -> None:
            """The reply in one write, framed as uvicorn frames it (``openenv_harness.http1``); the
            connection closed after it unless kept alive."""
            status, body = response.status_code, response.body
            head = response_head(status, (*self.server_state.default_headers, *response.raw_headers), cycle.keep_alive)
            cycle.keep_alive = head.keep_alive
            self.transport.write(head.data + (chunk(body, last=True) if head.chunked else body))
            if self.access_log:
                self.access_logger.info('%s - "POST chat" %d', self.client and self.client[0], status)
            cycle.response_complete = True
            if not cycle.keep_alive:
                self.transport.close()

else:  # pragma: no cover
    AgentCallProtocol = None  # type: ignore[assignment,misc]


def agent_protocol_class() -> type | None:
    """The protocol class to give uvicorn (``http=``), or None to let uvicorn choose its own."""
    if AgentCallProtocol is None or not all(callable(getattr(HttpToolsProtocol, m, None)) for m in _METHODS):
        log.warning("recorder: this uvicorn's httptools protocol is not the one the agent fast path knows; "
                    "serving chat calls through ASGI")
        return None
    return AgentCallProtocol
