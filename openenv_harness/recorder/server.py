"""Run a recorder: in a background thread (trainers, tests, white-box runs) or as a process.

uvicorn with uvloop and httptools when available (they are part of ``uvicorn[standard]``): the
pure-Python HTTP stack is where a proxy's per-call time goes. Its httptools protocol is replaced by
``chat_protocol.ChatProtocol``, which answers agent chat calls without an ASGI cycle and leaves
every other request to uvicorn.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Any, Callable

import uvicorn

from openenv_harness.recorder.app import RecorderApp, create_recorder_app
from openenv_harness.recorder.chat_protocol import chat_protocol_class
from openenv_harness.recorder.context import RecorderConfig, RecorderContext
from openenv_harness.recorder.heap import HeapTrimmer, freeze_startup_heap
from openenv_harness.recorder.upstream.base import Upstream


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


#: Keep-alive and backlog for apps that are not a recorder (the reference engine, test doubles).
_DEFAULTS = RecorderConfig.model_fields


def connection_settings(app: Any) -> dict[str, Any]:
    """The uvicorn settings for how connections are held, one source for ``serve`` and
    ``ThreadedServer``: the idle keep-alive timeout, the listen backlog, and the bound on a request
    head when uvicorn's own h11 protocol serves it (the chat protocol bounds heads itself:
    ``chat_protocol.py``).

    Why explicit: uvicorn's default keep-alive (5 s) is shorter than its clients' (aiohttp 15 s), so
    an agent pausing between calls reused connections the recorder was closing and got resets.
    """
    if not isinstance(app, RecorderApp):
        return {"timeout_keep_alive": _DEFAULTS["keep_alive_timeout_s"].default,
                "backlog": _DEFAULTS["listen_backlog"].default}
    config = app.state.ctx.config
    return {"timeout_keep_alive": config.keep_alive_timeout_s, "backlog": config.listen_backlog,
            "h11_max_incomplete_event_size": config.max_header_bytes}


class ThreadedServer:
    """A uvicorn server for any ASGI app on a daemon thread, bound to an ephemeral port."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int | None = None, log_level: str = "warning",
                 http: str | type | None = None) -> None:
        """``http``: uvicorn's protocol ("httptools", "h11", a class); the chat fast path by default."""
        self.app = app
        self.host = host
        self.port = port or free_port(host)
        self._config = uvicorn.Config(
            app, host=host, port=self.port, log_level=log_level, access_log=False, lifespan="on",
            loop="asyncio", http=http or chat_protocol_class() or "auto",
            # an in-process server must not reconfigure the host process's logging
            log_config=None, **connection_settings(app),
        )
        self._server = uvicorn.Server(self._config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return getattr(self, "_loop", None)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._server.serve())

    def start(self, timeout_s: float = 30.0) -> "ThreadedServer":
        self._thread = threading.Thread(target=self._run, name=f"uvicorn:{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"server on port {self.port} failed to start")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on port {self.port} did not start in {timeout_s}s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=15)
            self._thread = None

    def __enter__(self) -> "ThreadedServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RecorderServer(ThreadedServer):
    """A recorder on a background thread. ``.ctx`` is its live context (sessions, fence, store)."""

    def __init__(
        self,
        config: RecorderConfig,
        *,
        upstreams: dict[str, Upstream] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
    ) -> None:
        app = create_recorder_app(config, upstreams=upstreams)
        super().__init__(app, host=host, port=port)
        app.state.ctx.listen = (host, self.port)
        self.config = config

    @property
    def ctx(self) -> RecorderContext:
        return self.app.state.ctx

    @property
    def admin_token(self) -> str:
        return self.ctx.admin_token

    @property
    def admin_url(self) -> str | None:
        """The admin listener's URL (``RecorderConfig.admin_port``), None without one."""
        listener = self.ctx.admin_listener
        return None if listener is None else listener.url


def serve(config: RecorderConfig, *, host: str = "127.0.0.1", port: int = 8765, log_level: str = "info",
          announce: Callable[[RecorderContext], None] | None = None) -> None:
    """Run a recorder in the foreground (the ``openenv-harness serve`` command). ``announce`` is
    called with the new recorder's context before it starts serving (the command prints a one-time
    viewer login link from it)."""
    app = create_recorder_app(config)
    app.state.ctx.listen = (host, port)
    # the recorder's own lines (the template certification at start, engine changes) beside uvicorn's
    ours = logging.getLogger("openenv_harness")
    if not ours.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        ours.addHandler(handler)
        ours.setLevel(log_level.upper())
    if announce is not None:
        announce(app.state.ctx)
    freeze_startup_heap()
    trimmer = HeapTrimmer().start()
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False,
                    http=chat_protocol_class() or "auto", **connection_settings(app))
    finally:
        trimmer.stop()
