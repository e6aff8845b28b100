"""What the relay tests share: the in-sandbox program, a real HTTP target, a severable TCP path.

Everything talks over loopback: the relay runs as its own ``python3`` process (as it would in a
sandbox), the target is a uvicorn app, and the dialer connects to the relay through
``CuttableProxy`` so a test can drop the socket mid-call the way a dying port proxy would. Kept out
of ``conftest.py`` (which holds the fixtures) so test modules import it by a name unique across
``tests/``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from openenv_harness.relay import RelayDialer, sandbox_program_sources

RELAY_SCRIPT_NAME = "sandbox_relay.py"
#: ``-S -E -s``: no site-packages, no PYTHON* variables -- the standard library and the uploaded
#: files are all the relay gets, as on a bare sandbox image.
BARE_PYTHON = [sys.executable, "-S", "-E", "-s"]


def install_relay_program(directory: Path) -> Path:
    """Write the in-sandbox program into ``directory`` as it is uploaded; returns the script."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, source in sandbox_program_sources().items():
        (directory / name).write_bytes(source)
    return directory / RELAY_SCRIPT_NAME


# -- the target: what the recorder would be ---------------------------------------------------


@dataclass
class TargetState:
    produced: int = 0
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    last_headers: dict[str, str] = field(default_factory=dict)


def build_target(state: TargetState) -> FastAPI:
    app = FastAPI()

    @app.post("/rollout/{session}/v1/chat/completions")
    async def chat(session: str, request: Request) -> Response:
        body = await request.json()
        state.last_headers = dict(request.headers)
        events, delay = int(body.get("events", 3)), float(body.get("delay", 0.0))

        async def stream() -> AsyncIterator[bytes]:
            for index in range(events):
                chunk = {"choices": [{"delta": {"content": f"tok{index}"}}], "session": session}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
                await asyncio.sleep(delay)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/echo")
    async def echo(request: Request) -> Response:
        data = await request.body()
        return Response(data, media_type="application/octet-stream",
                        headers={"x-body-sha256": hashlib.sha256(data).hexdigest()})

    @app.get("/headers")
    async def headers(request: Request) -> JSONResponse:
        return JSONResponse(dict(request.headers))

    @app.get("/big")
    async def big(size: int) -> Response:
        piece = b"b" * 65536

        async def stream() -> AsyncIterator[bytes]:
            sent = 0
            while sent < size:
                part = piece[: min(len(piece), size - sent)]
                sent += len(part)
                state.produced = sent
                yield part

        return StreamingResponse(stream(), media_type="application/octet-stream")

    @app.get("/hang")
    async def hang(request: Request) -> Response:
        while not await request.is_disconnected():
            await asyncio.sleep(0.05)
        state.disconnected.set()
        return Response(b"")

    @app.get("/drip")
    async def drip(request: Request) -> Response:
        async def stream() -> AsyncIterator[bytes]:
            try:
                for index in range(200):
                    yield f"data: {index}\n\n".encode()
                    await asyncio.sleep(0.05)
            finally:
                state.disconnected.set()

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


@dataclass
class Target:
    url: str
    state: TargetState


# -- the in-sandbox relay as a real process ----------------------------------------------------


@dataclass
class RelayProcess:
    process: asyncio.subprocess.Process
    http_port: int
    ws_port: int
    stderr_path: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def ws_url(self, port: int | None = None) -> str:
        return f"ws://127.0.0.1:{port or self.ws_port}/relay"

    def log_text(self) -> str:
        return self.stderr_path.read_text()


StartRelay = Callable[..., Awaitable[RelayProcess]]


# -- a TCP path between dialer and relay that a test can cut ------------------------------------


class CuttableProxy:
    """Forwards TCP to ``127.0.0.1:upstream_port``; ``sever()`` drops every live connection."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._live: set[asyncio.StreamWriter] = set()

    async def start(self) -> "CuttableProxy":
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._live.update({writer, up_writer})

        async def copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.transport.abort()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
        self._live.difference_update({writer, up_writer})

    def sever(self) -> None:
        for writer in list(self._live):
            writer.transport.abort()

    async def close(self) -> None:
        self.sever()
        if self._server is not None:
            self._server.close()


# -- dialers ------------------------------------------------------------------------------------


MakeDialer = Callable[..., Awaitable[RelayDialer]]


async def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll until ``condition()`` holds; fail the test after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)
