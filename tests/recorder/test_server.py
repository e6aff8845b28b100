"""How the recorder's server holds connections: idle keep-alive connections and the listen queue.

Why: an agent pauses between calls (its tool time, the engine's latency elsewhere) and reuses its
keep-alive connection for the next one. A server that closes idle connections sooner than its
clients do races them: a client sends on a connection the server is closing and gets a reset
("Connection reset by peer", "Can not write request body"). uvicorn closes idle connections after
5 s by default; aiohttp keeps them 15 s and Node's fetch about 4 s. The recorder keeps them
``keep_alive_timeout_s`` (75 s), in its own process and in-process alike, and listens with a
configured ``listen_backlog``.

The recorder process is the one ``openenv-harness serve`` and ``python -m openenv_harness.recorder``
run (``server.serve``); the in-process server is ``RecorderServer``. Raw sockets, so that what is
tested is the connection itself and no client's pooling or retries.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from openenv_harness.recorder import RecorderConfig, RecorderServer
from openenv_harness.recorder.serving import free_port
from openenv_harness.testing.engine import EngineServer
from openenv_harness.testing.recorder_process import start_recorder_process

from agentloop import ADMIN

#: Longer than uvicorn's default keep-alive (5 s) and shorter than the recorder's.
IDLE_S = 7.0
HEALTH = b"GET /healthz HTTP/1.1\r\nhost: recorder\r\n\r\n"


def _read_reply(sock: socket.socket) -> bytes:
    """One whole reply to ``GET /healthz`` (its body has a length), or what came before the server
    closed the connection (b"" when it had closed it before answering)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def _ask_after_idle(port: int, idle_s: float) -> bytes:
    """A request, ``idle_s`` of silence, then a second request on the same connection: the second
    reply (b"" or a reset when the server had closed the connection meanwhile)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(HEALTH)
        assert _read_reply(sock).startswith(b"HTTP/1.1 200")
        time.sleep(idle_s)
        try:
            sock.sendall(HEALTH)
            return _read_reply(sock)
        except ConnectionResetError:
            return b"reset"


def _closed_by_server(port: int, within_s: float) -> bool:
    """Whether the server closes a connection left idle after one request, waiting ``within_s`` at most."""
    with socket.create_connection(("127.0.0.1", port), timeout=within_s) as sock:
        sock.sendall(HEALTH)
        assert _read_reply(sock).startswith(b"HTTP/1.1 200")
        try:
            return sock.recv(1) == b""
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True


@pytest.fixture
def recorder_process(tmp_path: Path, engine: EngineServer) -> Iterator[int]:
    """The recorder as ``python -m openenv_harness.recorder`` runs it, default settings: its port."""
    port = free_port()
    proc = start_recorder_process(tmp_path / "r.db", engine.url, port, ADMIN)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow  # idles IDLE_S (7 s) on the connection
def test_the_recorder_process_keeps_an_idle_connection_longer_than_uvicorns_default(recorder_process: int) -> None:
    assert _ask_after_idle(recorder_process, IDLE_S).startswith(b"HTTP/1.1 200")


@pytest.mark.slow  # idles IDLE_S (7 s) on the connection
def test_the_in_process_recorder_keeps_an_idle_connection_as_long(tmp_path: Path, engine: EngineServer) -> None:
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN)
    with RecorderServer(config) as server:
        assert _ask_after_idle(server.port, IDLE_S).startswith(b"HTTP/1.1 200")


def test_a_configured_keep_alive_timeout_is_the_one_the_process_applies(tmp_path: Path, engine: EngineServer) -> None:
    """A short configured timeout closes an idle connection (so the flag reaches the server), and a
    connection in use is not closed by it."""
    port = free_port()
    proc = start_recorder_process(tmp_path / "r.db", engine.url, port, ADMIN, "--keep-alive-s", "1")
    try:
        assert _closed_by_server(port, within_s=60)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_configured_keep_alive_timeout_is_the_one_the_in_process_server_applies(tmp_path: Path,
                                                                                 engine: EngineServer) -> None:
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN,
                            keep_alive_timeout_s=1)
    with RecorderServer(config) as server:
        assert _closed_by_server(server.port, within_s=60)


def _listen_backlog(port: int) -> int:
    """The listen queue's size the kernel gave the socket on ``port`` (``ss``: Send-Q of a listener)."""
    ss = shutil.which("ss")
    assert ss is not None, "ss (iproute2) is needed to read a listen socket's backlog"
    out = subprocess.run([ss, "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()]
    assert len(rows) == 1, out
    return int(rows[0][2])


def test_the_configured_backlog_is_what_the_listen_socket_gets(tmp_path: Path, engine: EngineServer) -> None:
    port = free_port()
    proc = start_recorder_process(tmp_path / "r.db", engine.url, port, ADMIN, "--backlog", "77")
    try:
        assert _listen_backlog(port) == 77
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    config = RecorderConfig(store_path=str(tmp_path / "r2.db"), engine_url=engine.url, admin_token=ADMIN,
                            listen_backlog=91)
    with RecorderServer(config) as server:
        assert _listen_backlog(server.port) == 91


def test_keep_alive_and_backlog_are_checked_settings(tmp_path: Path) -> None:
    for bad in ({"keep_alive_timeout_s": 0}, {"listen_backlog": 0}):
        with pytest.raises(ValueError):
            RecorderConfig(store_path=str(tmp_path / "r.db"), **bad)
