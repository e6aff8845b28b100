"""The in-sandbox relay program, run as a real process: what the agent and the trainer see."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import httpx
import pytest
from relay_support import BARE_PYTHON, MakeDialer, StartRelay, Target, install_relay_program
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from openenv_harness.relay import protocol as wire
from openenv_harness.relay.protocol import FrameKind


async def raw_call(port: int, request: bytes, *, read_until_close: bool = True) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(-1) if read_until_close else reader.read(65536), 10)
    writer.close()
    return data


async def test_a_call_without_a_trainer_gets_a_retryable_503(start_relay: StartRelay) -> None:
    relay = await start_relay("--connect-wait-s", "0.2", "--retry-after-s", "3")
    started = time.monotonic()
    async with httpx.AsyncClient() as client:
        reply = await client.post(f"{relay.base}/rollout/s/v1/chat/completions", json={})
    assert reply.status_code == 503
    assert reply.headers["retry-after"] == "3"
    assert reply.json()["error"]["type"] == "relay_unavailable"
    assert time.monotonic() - started >= 0.2, "the call waits for a trainer before giving up"


async def test_a_waiting_call_goes_through_once_the_trainer_connects(
    start_relay: StartRelay, make_dialer: MakeDialer, target: Target
) -> None:
    relay = await start_relay("--connect-wait-s", "10")
    async with httpx.AsyncClient(timeout=20) as client:
        call = asyncio.ensure_future(client.get(f"{relay.base}/headers"))
        await asyncio.sleep(0.3)
        assert not call.done()
        await make_dialer(relay.ws_url(), target.url)
        reply = await call
    assert reply.status_code == 200 and "user-agent" in reply.json()


@pytest.mark.parametrize(
    "path, headers, status",
    [
        ("/elsewhere", {"x-relay-token": "tok-RIGHT-7f3a"}, 404),
        ("/relay", {}, 401),
        ("/relay", {"x-relay-token": "tok-WRONG-91cd"}, 401),
    ],
)
async def test_the_relay_refuses_unknown_paths_and_wrong_tokens(
    start_relay: StartRelay, path: str, headers: dict[str, str], status: int
) -> None:
    relay = await start_relay("--token-env", "RELAY_TOKEN", env={**os.environ, "RELAY_TOKEN": "tok-RIGHT-7f3a"})
    with pytest.raises(InvalidStatus) as info:
        async with connect(f"ws://127.0.0.1:{relay.ws_port}{path}", additional_headers=headers):
            pass
    assert info.value.response.status_code == status
    assert "tok-RIGHT" not in relay.log_text() and "tok-WRONG" not in relay.log_text()


async def test_a_plain_http_request_on_the_trainer_port_is_not_an_upgrade(start_relay: StartRelay) -> None:
    relay = await start_relay()
    reply = await raw_call(relay.ws_port, b"GET /relay HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400") and b"Upgrade: websocket" in reply


async def test_the_relay_will_not_run_with_an_empty_token_variable(tmp_path: Path) -> None:
    script = install_relay_program(tmp_path)
    process = await asyncio.create_subprocess_exec(
        *BARE_PYTHON, str(script), "--http-port", "0", "--ws-port", "0", "--token-env", "NOPE_UNSET",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={"PATH": os.environ["PATH"]},
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 10)
    assert process.returncode == 2 and b"NOPE_UNSET" in stderr


async def test_watchdog_exits_when_no_trainer_ever_connects(start_relay: StartRelay) -> None:
    relay = await start_relay("--idle-exit-s", "0.5")
    assert await asyncio.wait_for(relay.process.wait(), 5) == 0
    assert "no trainer connected for 0.5s" in relay.log_text()


async def test_watchdog_exits_after_the_trainer_leaves(
    start_relay: StartRelay, make_dialer: MakeDialer, target: Target
) -> None:
    relay = await start_relay("--idle-exit-s", "0.6")
    dialer = await make_dialer(relay.ws_url(), target.url)
    await asyncio.sleep(1.0)
    assert relay.process.returncode is None, "a connected trainer keeps the relay alive"
    await dialer.aclose()
    assert await asyncio.wait_for(relay.process.wait(), 5) == 0


async def test_relay_drops_a_trainer_that_goes_silent(start_relay: StartRelay) -> None:
    relay = await start_relay()
    async with connect(relay.ws_url(), compression=None, ping_interval=None) as ws:
        await ws.send(wire.json_frame(FrameKind.HELLO, 0, {"version": 1, "window": wire.DEFAULT_WINDOW,
                                                           "ping_interval_s": 0.2}))
        ready = wire.decode_frame(await ws.recv())
        assert ready.kind is FrameKind.READY and ready.json()["window"] == wire.DEFAULT_WINDOW
        started = time.monotonic()
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5)
    assert 0.5 <= time.monotonic() - started < 3, "silence for three ping intervals ends the link"
    assert "trainer went silent" in relay.log_text()


async def test_relay_answers_pings_and_rejects_a_bad_hello(start_relay: StartRelay) -> None:
    relay = await start_relay()
    async with connect(relay.ws_url(), compression=None) as ws:
        await ws.send(wire.json_frame(FrameKind.HELLO, 0, {"version": 1, "window": 1 << 20, "ping_interval_s": 5}))
        wire.decode_frame(await ws.recv())
        await ws.send(wire.encode_frame(FrameKind.PING, 0, b"abc"))
        pong = wire.decode_frame(await asyncio.wait_for(ws.recv(), 2))
        assert (pong.kind, pong.payload) == (FrameKind.PONG, b"abc")
    async with connect(relay.ws_url(), compression=None) as ws:
        await ws.send(wire.json_frame(FrameKind.HELLO, 0, {"version": 99, "window": 1 << 20, "ping_interval_s": 5}))
        with pytest.raises(ConnectionClosed) as info:
            await asyncio.wait_for(ws.recv(), 2)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1002
    assert "unsupported protocol version 99" in relay.log_text()


async def test_chunked_request_bodies_keep_alive_and_100_continue(
    start_relay: StartRelay, make_dialer: MakeDialer, target: Target
) -> None:
    relay = await start_relay()
    await make_dialer(relay.ws_url(), target.url)
    first = (b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
             b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    second = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.http_port)
    writer.write(first)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked" in head
    assert b"Connection: keep-alive" in head
    assert await reader.readuntil(b"0\r\n\r\n") == b"b\r\nhello world\r\n0\r\n\r\n"
    writer.write(second)  # same connection: keep-alive
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"abc")
    rest = await asyncio.wait_for(reader.read(-1), 10)
    assert rest.startswith(b"HTTP/1.1 200") and b"Connection: close" in rest and rest.endswith(b"3\r\nabc\r\n0\r\n\r\n")
    writer.close()


async def test_malformed_agent_requests_get_a_clear_400(start_relay: StartRelay) -> None:
    relay = await start_relay()
    request = b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
    reply = await raw_call(relay.http_port, request)
    assert reply.startswith(b"HTTP/1.1 400")
    error = json.loads(reply.partition(b"\r\n\r\n")[2])["error"]
    assert error["message"] == "both Content-Length and Transfer-Encoding given"
