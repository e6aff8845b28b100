"""Run the reference engine on a real loopback port, in a background thread.

Why a real server rather than an in-process transport: the code under test (the recorder, the
agent CLIs) talks HTTP, streams SSE and sees dropped connections; only a real socket shows all of
that. ``EngineServer`` binds ``127.0.0.1`` on an ephemeral port, serves with uvicorn in a daemon
thread (its lean routes answered from the HTTP parser, ``protocol.py``, as in the engine's own
process) and offers the ``/_ref/`` controls as plain methods (over HTTP, like any other client).
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Any

import httpx
import uvicorn

from openenv_harness.testing.engine.app import create_engine_app
from openenv_harness.testing.engine.config import EngineConfig
from openenv_harness.testing.engine.faults import Fault
from openenv_harness.testing.engine.policy import Script
from openenv_harness.testing.engine.protocol import engine_protocol_class
from openenv_harness.testing.engine.state import DEFAULT_KEY


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening-ready TCP socket; port 0 picks a free one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


class EngineServer:
    """A reference engine listening on loopback; use as a context manager or ``start()``/``stop()``."""

    def __init__(self, config: EngineConfig | None = None, host: str = "127.0.0.1", port: int = 0,
                 http: str | type | None = None) -> None:
        """``http``: uvicorn's protocol ("httptools", "h11", a class); by default the one that answers
        the lean routes without an ASGI cycle (``protocol.py``)."""
        self.config = config or EngineConfig()
        self._http = http
        self.app = create_engine_app(self.config)
        self._host = host
        self._port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    @property
    def port(self) -> int:
        if self._socket is None:
            raise RuntimeError("the engine server is not started")
        return self._socket.getsockname()[1]

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:41234`` (OpenAI clients want ``url + '/v1'``)."""
        return f"http://{self._host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """What an OpenAI client (or a recorder's upstream setting) is given: ``url + '/v1'``."""
        return self.url + "/v1"

    def start(self, timeout_s: float = 10.0) -> EngineServer:
        if self._thread is not None:
            raise RuntimeError("the engine server is already started")
        self._socket = bind_socket(self._host, self._port)
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=1, http=self._http or engine_protocol_class() or "auto")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name=f"reference-engine-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the reference engine did not start")
            time.sleep(0.005)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout_s)
        if self._socket is not None:
            self._socket.close()
        self._server, self._thread, self._socket = None, None, None

    def __enter__(self) -> EngineServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- test controls, over HTTP ------------------------------------------------------------

    def _post(self, path: str, payload: Any = None) -> Any:
        response = httpx.post(self.url + path, json=payload, timeout=30.0)
        response.raise_for_status()
        return response.json()

    def set_script(self, key: str, script: Script | dict[str, Any]) -> None:
        """Script the model for requests known by ``key`` (session header, model name, or ``*``)."""
        body = script.model_dump(mode="json") if isinstance(script, Script) else script
        self._post("/_ref/scripts", {"key": key, "script": body})

    def add_fault(self, key: str, fault: Fault | dict[str, Any]) -> None:
        body = fault.model_dump(mode="json") if isinstance(fault, Fault) else fault
        self._post("/_ref/faults", {"key": key, "fault": body})

    def requests(self, key: str | None = None) -> list[dict[str, Any]]:
        """Requests received (headers and bodies), for one key or all of them."""
        params = {"key": key} if key is not None else None
        response = httpx.get(self.url + "/_ref/requests", params=params, timeout=30.0)
        response.raise_for_status()
        return response.json()["requests"]

    def reset(self) -> None:
        self._post("/_ref/reset")

    def pause(self, mode: str = "keep", timeout_s: float = 60.0) -> None:
        response = httpx.post(self.url + "/pause", params={"mode": mode}, timeout=timeout_s)
        response.raise_for_status()

    def resume(self) -> None:
        self._post("/resume")

    def is_paused(self) -> bool:
        response = httpx.get(self.url + "/is_paused", timeout=30.0)
        response.raise_for_status()
        return bool(response.json()["is_paused"])

    def info(self) -> dict[str, Any]:
        response = httpx.get(self.url + "/_ref/info", timeout=30.0)
        response.raise_for_status()
        return response.json()


__all__ = ["DEFAULT_KEY", "EngineServer", "bind_socket"]
