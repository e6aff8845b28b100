"""Serving any ASGI app with uvicorn: on a daemon thread bound to a free port (trainers, tests, the
admin listener, the reference engine), with the connection settings a recorder needs.

A leaf: it knows no recorder. The agent-call protocol it hands uvicorn answers agent calls without ASGI
for an app that carries a recorder (``edge/agent_protocol.py``) and leaves every other request to uvicorn.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn

from openenv_harness.recorder.context import RecorderConfig
from openenv_harness.recorder.edge.agent_protocol import agent_protocol_class


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


#: Keep-alive and backlog for apps that are not a recorder (the reference engine, test doubles).
_DEFAULTS = RecorderConfig.model_fields


def connection_settings(app: Any) -> dict[str, Any]:
    """The uvicorn settings for how connections are held, one source for ``server.serve`` and
    ``ThreadedServer``: the idle keep-alive timeout, the listen backlog, and the bound on a request
    head when uvicorn's own h11 protocol serves it (the agent-call protocol bounds heads itself:
    ``edge/agent_protocol.py``). A recorder's app says its own (``RecorderApp.connection_settings``).

    Why explicit: uvicorn's default keep-alive (5 s) is shorter than its clients' (aiohttp 15 s), so
    an agent pausing between calls reused connections the recorder was closing and got resets.
    """
    own = getattr(app, "connection_settings", None)
    if callable(own):
        return dict(own())
    return {"timeout_keep_alive": _DEFAULTS["keep_alive_timeout_s"].default,
            "backlog": _DEFAULTS["listen_backlog"].default}


class ThreadedServer:
    """A uvicorn server for any ASGI app on a daemon thread, bound to an ephemeral port."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int | None = None, log_level: str = "warning",
                 http: str | type | None = None) -> None:
        """``http``: uvicorn's protocol ("httptools", "h11", a class); the agent fast path by default."""
        self.app = app
        self.host = host
        self.port = port or free_port(host)
        self._config = uvicorn.Config(
            app, host=host, port=self.port, log_level=log_level, access_log=False, lifespan="on",
            loop="asyncio", http=http or agent_protocol_class() or "auto",
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

    def start(self, timeout_s: float = 30.0) -> ThreadedServer:
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

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
