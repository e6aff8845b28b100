"""The reference engine's lean POST routes answered from uvicorn's HTTP parser, without an ASGI cycle.

Why: an incremental recorder call waits on three of the engine's lean routes in a row (render,
generate or ``/v1/completions``, derender) where full history waits on one chat call, and after the
routes skipped FastAPI's machinery (``app.EngineApp``) each request still paid uvicorn's ASGI
request cycle: a cycle object with its event, a task running the app, receive and send coroutines
and their message dicts, and two socket writes per reply (``docs/benchmarks.md``). Here, as in the
recorder's own ``recorder/edge/agent_protocol.py``, the parser's callbacks collect the body, the same
handler runs (``app.lean_reply``), and the reply leaves in one write, framed by the rules uvicorn's
cycle uses (``openenv_harness.http1``), so the bytes on the wire are the ones the ASGI path sends.

Everything else stays uvicorn's and the app's: other routes and methods, the API-key 401,
pipelined requests (a request arriving while an earlier one on the connection is answered),
``Expect: 100-continue``, upgrades, keep-alive timeouts, graceful shutdown. A streamed reply (the
chat route with ``stream: true``) is written as it goes by the response object itself, with a
disconnect heard as uvicorn's cycle reports it, so a client hanging up ends the stream the same way.

Coupling: this subclasses uvicorn's ``HttpToolsProtocol`` and uses a few of its attributes, like the
recorder's protocol; ``engine_protocol_class`` returns None (plain uvicorn) where they are missing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from openenv_harness.http1 import chunk, fast_path, response_head
from openenv_harness.testing.engine.app import EngineApp, lean_reply
from openenv_harness.testing.engine.chat import TRANSPORT_SCOPE_KEY

log = logging.getLogger(__name__)

try:  # uvicorn[standard] brings httptools; without it uvicorn serves with h11 and nothing here applies
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string
except ImportError:  # pragma: no cover -- httptools is a dependency of this package
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

_METHODS = ("on_message_begin", "on_headers_complete", "on_body", "on_message_complete", "on_response_complete",
            "connection_lost", "shutdown")
_ATTRIBUTES = ("parser", "headers", "scope", "transport", "flow", "tasks", "cycle", "server_state", "loop", "config",
               "expect_100_continue", "access_log", "access_logger")
_500 = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21"), (b"connection", b"close")]


class _Answering:
    """Stands in for uvicorn's request cycle while a lean request is answered: uvicorn's code reads
    and sets these when the connection is lost (``disconnected``, ``message_event``), on shutdown
    (``keep_alive``) and when a pipelined request arrives behind this one (``response_complete``)."""

    __slots__ = ("response_started", "response_complete", "disconnected", "keep_alive", "message_event", "body",
                 "_read")

    def __init__(self, keep_alive: bool, body: bytes) -> None:
        self.response_started = False
        self.response_complete = False
        self.disconnected = False
        self.keep_alive = keep_alive
        self.message_event = asyncio.Event()
        self.body = body
        self._read = False

    async def receive(self) -> dict[str, Any]:
        """The ASGI receive the handler's request reads: the whole body, then (to a streamed reply
        listening for it) a disconnect once the client is gone or the reply is complete."""
        if not self._read:
            self._read = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        while not (self.disconnected or self.response_complete):
            await self.message_event.wait()
            self.message_event.clear()
        return {"type": "http.disconnect"}


class _LeanRequest:
    __slots__ = ("handler", "scope", "keep_alive", "chunks")

    def __init__(self, handler: Callable[[Request], Awaitable[Response]], scope: dict[str, Any],
                 keep_alive: bool) -> None:
        self.handler = handler
        self.scope = scope
        self.keep_alive = keep_alive
        self.chunks: list[bytes] = []


def _plain(response: Response) -> bool:
    """A reply whose whole body is known (no stream, no background task): written here in one go."""
    return type(response).__call__ is Response.__call__ and response.background is None


if HttpToolsProtocol is not None:

    class EngineProtocol(HttpToolsProtocol):  # type: ignore[misc,valid-type]
        """uvicorn's httptools protocol, with the engine's lean POST routes answered without ASGI."""

        def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any], _loop: Any = None) -> None:
            super().__init__(config, server_state, app_state, _loop)
            app = config.app
            usable = (isinstance(app, EngineApp) and not config.root_path and config.limit_concurrency is None
                      and all(hasattr(self, name) for name in _ATTRIBUTES))
            self._app: EngineApp | None = app if usable else None
            #: the header a /v1 request must carry (vLLM's --api-key), fixed for the app's life
            self._auth = (b"authorization", f"Bearer {app.state.engine.config.api_key}".encode()) \
                if self._app is not None and app.state.engine.config.api_key else None
            self._lean: _LeanRequest | None = None

        # -- parser callbacks: a lean request is collected here, anything else is uvicorn's ------------

        def on_headers_complete(self) -> None:
            self._lean = self._lean_request()
            if self._lean is None:
                super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if self._lean is not None:
                self._lean.chunks.append(body)
            else:
                super().on_body(body)

        def on_message_complete(self) -> None:
            request, self._lean = self._lean, None
            if request is None:
                super().on_message_complete()
                return
            cycle = _Answering(request.keep_alive, b"".join(request.chunks))
            self.cycle = cycle  # type: ignore[assignment]
            task = self.loop.create_task(self._answer(request, cycle))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)

        def _lean_request(self) -> _LeanRequest | None:
            app, parser = self._app, self.parser
            target = fast_path(self) if app is not None else None
            if target is None:
                return None
            raw_path, path, query = target
            handler = app.lean_routes.get(path)
            if handler is None:
                return None
            if self._auth is not None and path.startswith("/v1") and self._auth not in self.headers:
                return None  # the app's ASGI entry answers vLLM's 401
            version = parser.get_http_version()
            scope = self.scope  # as uvicorn fills it (on_message_begin, on_headers_complete)
            scope["method"] = "POST"
            if version != "1.1":
                scope["http_version"] = version
            scope["path"], scope["raw_path"], scope["query_string"] = path, raw_path, query
            scope[TRANSPORT_SCOPE_KEY] = self.transport  # a drop fault cuts it (``chat.drop_connection``)
            return _LeanRequest(handler, scope, version != "1.0" and parser.should_keep_alive())

        # -- answering ---------------------------------------------------------------------------------

        async def _answer(self, request: _LeanRequest, cycle: _Answering) -> None:
            try:
                response = await lean_reply(request.handler, Request(request.scope, cycle.receive))
                if self.flow.write_paused and not cycle.disconnected:
                    await self.flow.drain()
                if cycle.disconnected or self.transport.is_closing():
                    return  # the client hung up, or a drop fault cut the connection: nothing is written
                if not _plain(response):
                    await response(request.scope, cycle.receive, self._streaming_send(request.scope, cycle))
                    return
                head = response_head(response.status_code, [*self.server_state.default_headers,
                                                             *response.raw_headers], cycle.keep_alive)
                body = response.body
                self.transport.write(head.data + (chunk(body, last=True) if head.chunked else body))
                self._complete(request.scope, response.status_code, cycle, head.keep_alive)
            except BaseException as exc:  # noqa: BLE001 -- what uvicorn's cycle does for an app that raises
                log.error("Exception in ASGI application\n", exc_info=exc)
                if cycle.response_complete or cycle.disconnected or self.transport.is_closing():
                    return
                if cycle.response_started:
                    self.transport.close()
                else:
                    head = response_head(500, [*self.server_state.default_headers, *_500], cycle.keep_alive)
                    self.transport.write(head.data + b"Internal Server Error")
                    self._complete(request.scope, 500, cycle, False)

        def _streaming_send(self, scope: dict[str, Any], cycle: _Answering) -> Callable[[Any], Awaitable[None]]:
            """An ASGI send for a streamed reply: the head, then each part as it comes (chunked)."""
            framing = {"chunked": False, "status": 200}

            async def send(message: dict[str, Any]) -> None:
                if self.flow.write_paused and not cycle.disconnected:
                    await self.flow.drain()
                if cycle.disconnected:
                    return
                if not cycle.response_started:
                    cycle.response_started = True
                    head = response_head(message["status"], [*self.server_state.default_headers,
                                                             *message.get("headers", [])], cycle.keep_alive)
                    cycle.keep_alive = head.keep_alive
                    framing["chunked"], framing["status"] = head.chunked, message["status"]
                    self.transport.write(head.data)
                elif not cycle.response_complete:
                    body, more = message.get("body", b""), message.get("more_body", False)
                    self.transport.write(chunk(body, last=not more) if framing["chunked"] else body)
                    if not more:
                        self._complete(scope, int(framing["status"]), cycle, cycle.keep_alive)
                else:
                    raise RuntimeError(f"Unexpected ASGI message '{message['type']}' sent, after response already "
                                       "completed.")
            return send

        def _complete(self, scope: dict[str, Any], status: int, cycle: _Answering, keep_alive: bool) -> None:
            if self.access_log:
                self.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(scope), scope["method"],
                                        get_path_with_query_string(scope), scope["http_version"], status)
            cycle.response_complete = True
            cycle.message_event.set()
            if not keep_alive or not cycle.keep_alive:
                self.transport.close()
            self.on_response_complete()

else:  # pragma: no cover
    EngineProtocol = None  # type: ignore[assignment,misc]


def engine_protocol_class() -> type | None:
    """The protocol class to give uvicorn (``http=``), or None to let uvicorn choose its own."""
    if EngineProtocol is None or not all(callable(getattr(HttpToolsProtocol, m, None)) for m in _METHODS):
        log.warning("reference engine: this uvicorn's httptools protocol is not the one the lean routes know; "
                    "serving them through ASGI")
        return None
    return EngineProtocol
