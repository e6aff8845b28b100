"""Fixtures for relay tests: a real relay process, a real HTTP target, a severable TCP path.

Everything talks over loopback: the relay runs as its own ``python3`` process (as it would in a
sandbox), the target is a uvicorn server on the test's event loop, and the dialer connects to the
relay through ``CuttableProxy`` so a test can drop the socket mid-call the way a dying port proxy
would. The helpers themselves live in ``relay_support``.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import uvicorn
from relay_support import (
    BARE_PYTHON,
    CuttableProxy,
    MakeDialer,
    RelayProcess,
    StartRelay,
    Target,
    TargetState,
    build_target,
    install_relay_program,
    wait_for,
)

from openenv_harness.relay import RelayDialer


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    state = TargetState()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(build_target(state), log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    yield Target(f"http://127.0.0.1:{sock.getsockname()[1]}", state)
    server.should_exit = True
    server.force_exit = True
    await asyncio.wait_for(task, 10)
    sock.close()


@pytest.fixture
async def start_relay(tmp_path: Path) -> AsyncIterator[StartRelay]:
    started: list[RelayProcess] = []
    script = install_relay_program(tmp_path / "relay-program")

    async def start(*args: str, env: dict[str, str] | None = None) -> RelayProcess:
        stderr_path = tmp_path / f"relay-{len(started)}.stderr"
        with stderr_path.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                *BARE_PYTHON, str(script), "--http-port", "0", "--ws-port", "0", *args,
                stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env,
            )
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 10)
        ready = json.loads(line)
        assert ready["event"] == "ready", ready
        relay = RelayProcess(process, ready["http_port"], ready["ws_port"], stderr_path)
        started.append(relay)
        return relay

    yield start
    for relay in started:
        if relay.process.returncode is None:
            relay.process.kill()
        await relay.process.wait()


@pytest.fixture
async def cuttable() -> AsyncIterator[Callable[[int], Awaitable[CuttableProxy]]]:
    proxies: list[CuttableProxy] = []

    async def make(port: int) -> CuttableProxy:
        proxy = await CuttableProxy(port).start()
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        await proxy.close()


@pytest.fixture
async def make_dialer() -> AsyncIterator[MakeDialer]:
    dialers: list[RelayDialer] = []

    async def make(ws_url: str, target_url: str, *, headers: dict[str, str] | None = None,
                   connect: bool = True, **kwargs: object) -> RelayDialer:
        kwargs.setdefault("backoff_initial_s", 0.05)
        kwargs.setdefault("backoff_max_s", 0.3)
        dialer = RelayDialer(lambda: ws_url, lambda: dict(headers or {}), target_url, **kwargs)  # type: ignore[arg-type]
        dialers.append(dialer)
        await dialer.start()
        if connect:
            await dialer.wait_connected(10)
        return dialer

    yield make
    for dialer in dialers:
        await dialer.aclose()


@pytest.fixture
def eventually() -> Callable[..., Awaitable[None]]:
    return wait_for
