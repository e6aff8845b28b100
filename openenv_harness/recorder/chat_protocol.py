"""Agent chat calls answered straight from uvicorn's HTTP parser, without an ASGI request cycle.

Why: the chat route is the recorder's only hot path, and under uvicorn each call also paid for an
ASGI scope, a request cycle with its event, a copy of the body, the proxy-headers middleware, a
Starlette response object and two socket writes (status and headers, then the body) -- about a
third of the event loop's samples at one 8k-token session (``docs/benchmarks.md``). Here the
parser's callbacks collect the body, ``flow.handle_chat`` runs the call, and the reply leaves in
one write.

Everything else stays uvicorn's: the admin API, the viewer, ``/v1/models``, lifespan, WebSockets,
keep-alive timeouts, graceful shutdown. A chat request takes this path only when nothing about it
is unusual -- POST to a chat route, no upgrade, no ``Expect: 100-continue``, no root path or
concurrency limit configured, no earlier request on the connection still being answered
(pipelining) -- and otherwise goes through uvicorn into the app's ASGI chat route, which runs the
same flow. Both paths give the same answers; the tests run the recorder through this one.

Coupling: this subclasses uvicorn's ``HttpToolsProtocol`` and uses a few of its attributes.
``chat_protocol_class`` checks them and returns None (plain uvicorn) when they are missing, and
each connection checks its own instance, so a uvicorn release that changes them costs speed, not
correctness.
"""

from __future__ import annotations

import http
import logging
import urllib.parse
from typing import Any

import httptools

from openenv_harness.recorder.app import RecorderApp
from openenv_harness.recorder.dialects import Dialect, agent_target
from openenv_harness.recorder.errors import AgentError, body_too_large
from openenv_harness.recorder.flow import handle_chat

log = logging.getLogger(__name__)

try:  # uvicorn[standard] brings httptools; without it uvicorn serves with h11 and nothing here applies
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover -- httptools is a dependency of this package
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

#: What this module uses of uvicorn's protocol: its methods, and attributes each instance must have.
_METHODS = ("on_headers_complete", "on_body", "on_message_complete", "on_response_complete", "connection_lost",
            "shutdown")
_ATTRIBUTES = ("parser", "headers", "transport", "tasks", "cycle", "server_state", "loop", "config",
               "expect_100_continue", "access_log", "access_logger", "client")

class _NoEvent:
    """uvicorn sets its cycle's event when the connection goes; an answering call waits on nothing."""

    def set(self) -> None:
        pass


_NO_EVENT = _NoEvent()


class _Answering:
    """Stands in for uvicorn's request cycle while a chat call is answered: uvicorn's own code reads
    these when the connection is lost (``disconnected``), on shutdown (``keep_alive``) and when a
    pipelined request arrives behind this one (``response_complete``: it is queued until then)."""

    __slots__ = ("response_complete", "disconnected", "keep_alive", "message_event")

    def __init__(self, keep_alive: bool) -> None:
        self.response_complete = False
        self.disconnected = False
        self.keep_alive = keep_alive
        self.message_event = _NO_EVENT


class _ChatRequest:
    """A chat request being read: its route, headers and body so far."""

    __slots__ = ("session_id", "dialect", "headers", "keep_alive", "chunks", "size", "limit", "too_large")

    def __init__(self, session_id: str | None, dialect: Dialect | None, headers: list[tuple[bytes, bytes]],
                 keep_alive: bool, limit: int) -> None:
        self.session_id = session_id
        self.dialect = dialect
        self.headers = headers
        self.keep_alive = keep_alive
        self.chunks: list[bytes] = []
        self.size = 0
        self.limit = limit
        self.too_large = False

    def add(self, chunk: bytes) -> None:
        if self.too_large:
            return  # read and dropped: the connection stays usable after the 413
        self.size += len(chunk)
        if self.size > self.limit:
            self.too_large, self.chunks = True, []
        else:
            self.chunks.append(chunk)


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


_STATUS_LINES = {status: _status_line(status) for status in range(100, 600)}


if HttpToolsProtocol is not None:

    class ChatProtocol(HttpToolsProtocol):  # type: ignore[misc,valid-type]
        """uvicorn's httptools protocol, with agent chat calls answered without ASGI."""

        def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any], _loop: Any = None) -> None:
            super().__init__(config, server_state, app_state, _loop)
            app = config.app
            usable = (isinstance(app, RecorderApp) and not config.root_path and config.limit_concurrency is None
                      and all(hasattr(self, name) for name in _ATTRIBUTES))
            self._recorder: RecorderApp | None = app if usable else None
            self._chat: _ChatRequest | None = None

        # -- parser callbacks: a chat request is collected here, anything else is uvicorn's -----------

        def on_headers_complete(self) -> None:
            self._chat = self._chat_request()
            if self._chat is None:
                super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if self._chat is not None:
                self._chat.add(body)
            else:
                super().on_body(body)

        def on_message_complete(self) -> None:
            request, self._chat = self._chat, None
            if request is None:
                super().on_message_complete()
                return
            cycle = _Answering(request.keep_alive)
            self.cycle = cycle  # type: ignore[assignment]
            task = self.loop.create_task(self._answer(request, cycle))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)

        def _chat_request(self) -> _ChatRequest | None:
            recorder, parser = self._recorder, self.parser
            if recorder is None or parser.get_method() != b"POST" or self.expect_100_continue or parser.should_upgrade():
                return None
            if self.cycle is not None and not self.cycle.response_complete:
                return None  # pipelined behind a call still being answered: uvicorn queues it in order
            url = getattr(self, "url", None)  # uvicorn sets it per request, in on_message_begin
            if not isinstance(url, bytes):
                return None
            raw_path = httptools.parse_url(url).path
            path = raw_path.decode("ascii")
            if "%" in path:
                path = urllib.parse.unquote(path)
            matched, session_id, dialect = agent_target(path)
            if not matched:
                return None
            keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
            return _ChatRequest(session_id, dialect, self.headers, keep_alive, recorder.state.ctx.config.max_body_bytes)

        # -- answering -------------------------------------------------------------------------------

        async def _answer(self, request: _ChatRequest, cycle: _Answering) -> None:
            assert self._recorder is not None
            ctx = self._recorder.state.ctx
            try:
                if request.too_large:
                    error = body_too_large(request.limit)
                    response = request.dialect.error(error) if request.dialect is not None else error.to_response()
                else:
                    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in request.headers}
                    response = await handle_chat(ctx, request.session_id, headers, b"".join(request.chunks),
                                                 request.dialect)
                status, head, body = response.status_code, response.raw_headers, response.body
            except Exception:  # noqa: BLE001 -- what uvicorn does for an app that raises: log, 500
                log.exception("recorder: a chat call failed unexpectedly")
                failure = AgentError(500, "internal error in the recorder", type="server_error").to_response()
                status, head, body = failure.status_code, failure.raw_headers, failure.body
                cycle.keep_alive = False
            if cycle.disconnected or self.transport.is_closing():
                return  # the agent hung up; the call was still recorded (or failed) as usual
            out = [_STATUS_LINES.get(status) or _status_line(status)]
            for name, value in (*self.server_state.default_headers, *head):
                out += [name, b": ", value, b"\r\n"]
            if not cycle.keep_alive:
                out.append(b"connection: close\r\n")
            out += [b"\r\n", body]
            self.transport.write(b"".join(out))
            if self.access_log:
                self.access_logger.info('%s - "POST chat" %d', self.client and self.client[0], status)
            cycle.response_complete = True
            if not cycle.keep_alive:
                self.transport.close()
            self.on_response_complete()

else:  # pragma: no cover
    ChatProtocol = None  # type: ignore[assignment,misc]


def chat_protocol_class() -> type | None:
    """The protocol class to give uvicorn (``http=``), or None to let uvicorn choose its own."""
    if ChatProtocol is None or not all(callable(getattr(HttpToolsProtocol, m, None)) for m in _METHODS):
        log.warning("recorder: this uvicorn's httptools protocol is not the one the chat fast path knows; "
                    "serving chat calls through ASGI")
        return None
    return ChatProtocol
