"""The trainer-side dialer with a real relay process and a real HTTP target, over loopback."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest
from relay_support import CuttableProxy, MakeDialer, StartRelay, Target, wait_for

from openenv_harness.relay import RelayDialer, RelayUnavailableError

Eventually = Callable[..., Awaitable[None]]
MakeCuttable = Callable[[int], Awaitable[CuttableProxy]]


async def test_streamed_replies_arrive_incrementally(
    start_relay: StartRelay, make_dialer: MakeDialer, target: Target
) -> None:
    relay = await start_relay()
    await make_dialer(relay.ws_url(), target.url)
    arrivals: list[float] = []
    async with httpx.AsyncClient(timeout=20) as client:
        started = time.monotonic()
        async with client.stream(
            "POST", f"{relay.base}/rollout/abc/v1/chat/completions", json={"events": 4, "delay": 0.25},
            headers={"Authorization": "Bearer sk-rollout-1"},
        ) as reply:
            assert reply.status_code == 200
            assert reply.headers["content-type"].startswith("text/event-stream")
            lines = []
            async for line in reply.aiter_lines():
                if line:
                    lines.append(line)
                    arrivals.append(time.monotonic() - started)
    assert lines[-1] == "data: [DONE]" and json.loads(lines[0][6:])["session"] == "abc"
    assert target.state.last_headers["authorization"] == "Bearer sk-rollout-1", "the agent's key reaches the target"
    assert arrivals[0] < 0.5 and arrivals[-1] > 0.9, f"events were buffered, not streamed: {arrivals}"


async def test_many_concurrent_calls_share_one_socket(
    start_relay: StartRelay, make_dialer: MakeDialer, target: Target
) -> None:
    relay = await start_relay()
    dialer = await make_dialer(relay.ws_url(), target.url)
    bodies = [os.urandom(1000 + 997 * index) for index in range(32)]
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64)) as client:
        replies = await asyncio.gather(*(client.post(f"{relay.base}/echo", content=body) for body in bodies))
    assert [reply.content for reply in replies] == bodies
    await wait_for(lambda: dialer.stats.calls_completed == 32)  # counted just after its last send
    assert dialer.stats.connects == 1 and dialer.stats.calls_failed == dialer.stats.calls_cut == 0


async def test_bodies_larger_than_a_websocket_frame_limit_work_both_ways(
    start_relay: StartRelay, make_dialer: MakeDialer, target: Target
) -> None:
    relay = await start_relay()
    await make_dialer(relay.ws_url(), target.url)
    body = os.urandom(5 * 1024 * 1024 + 123)
    async with httpx.AsyncClient(timeout=60) as client:
        reply = await client.post(f"{relay.base}/echo", content=body)
    assert reply.status_code == 200
    assert reply.headers["x-body-sha256"] == hashlib.sha256(body).hexdigest(), "the target got the whole body"
    assert reply.content == body


async def test_a_drop_mid_stream_ends_the_agents_stream_and_the_dialer_reconnects(
    start_relay: StartRelay, make_dialer: MakeDialer, target: Target, cuttable: MakeCuttable,
    eventually: Eventually,
) -> None:
    relay = await start_relay()
    path = await cuttable(relay.ws_port)
    dialer = await make_dialer(relay.ws_url(path.port), target.url)
    async with httpx.AsyncClient(timeout=20) as client:
        async with client.stream("GET", f"{relay.base}/drip") as reply:
            assert reply.status_code == 200
            lines = reply.aiter_lines()
            assert await lines.__anext__() == "data: 0"
            path.sever()
            with pytest.raises(httpx.RemoteProtocolError):
                async for _ in lines:
                    pass
        await eventually(lambda: dialer.stats.connects == 2)
        assert dialer.stats.disconnects == 1
        # the call was cut mid-reply: failed, never completed
        stats = dialer.stats
        assert (stats.calls_started, stats.calls_completed, stats.calls_failed, stats.calls_cut) == (1, 0, 1, 1)
        await eventually(target.state.disconnected.is_set)  # the target saw the call go away
        reply = await client.post(f"{relay.base}/echo", content=b"after the drop")
        assert reply.content == b"after the drop"


async def test_a_drop_before_the_reply_head_gives_a_retryable_502(
    start_relay: StartRelay, make_dialer: MakeDialer, target: Target, cuttable: MakeCuttable,
) -> None:
    relay = await start_relay()
    path = await cuttable(relay.ws_port)
    await make_dialer(relay.ws_url(path.port), target.url)
    async with httpx.AsyncClient(timeout=20) as client:
        call = asyncio.ensure_future(client.get(f"{relay.base}/hang"))
        await asyncio.sleep(0.3)
        path.sever()
        reply = await call
    assert reply.status_code == 502
    assert reply.json()["error"]["type"] == "relay_error"


async def test_an_agent_that_hangs_up_cancels_the_call_on_the_target(
    start_relay: StartRelay, make_dialer: MakeDialer, target: Target, eventually: Eventually
) -> None:
    relay = await start_relay()
    dialer = await make_dialer(relay.ws_url(), target.url)
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.http_port)
    writer.write(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(0.3)
    writer.transport.abort()
    await eventually(target.state.disconnected.is_set)
    await eventually(lambda: dialer.stats.calls_cancelled == 1)


async def test_a_slow_agent_bounds_what_the_trainer_side_holds(
    start_relay: StartRelay, make_dialer: MakeDialer, target: Target, eventually: Eventually
) -> None:
    window = 128 * 1024
    relay = await start_relay("--window-bytes", str(window))
    # Fixed socket buffers on both TCP legs, so kernel autotuning (up to tens of MiB on some
    # machines) cannot blur what flow control holds back.
    small_buffers = [(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)]
    upstream = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(socket_options=small_buffers), timeout=None)
    dialer = await make_dialer(relay.ws_url(), target.url, window=window, http_client=upstream)
    total = 48 * 1024 * 1024
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.http_port, limit=1 << 16)
    writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    writer.write(f"GET /big?size={total} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await reader.readuntil(b"\r\n\r\n")
    writer.transport.pause_reading()  # the agent stops reading
    await asyncio.sleep(1.0)
    stalled_at = target.state.produced
    await asyncio.sleep(0.5)
    assert target.state.produced == stalled_at, "the target kept producing while the agent read nothing"
    assert stalled_at < total // 3, f"the trainer side buffered {stalled_at} bytes for a stalled agent"
    assert dialer.stats.max_unacked_bytes <= window
    writer.transport.resume_reading()
    received = 0
    while True:  # chunked framing: count payload bytes until the terminal chunk
        size = int((await reader.readline()).strip(), 16)
        if size == 0:
            break
        received += len(await reader.readexactly(size))
        await reader.readexactly(2)
    writer.close()
    await upstream.aclose()
    assert received == total and target.state.produced == total


async def test_calls_outside_the_allowed_prefixes_are_refused(
    start_relay: StartRelay, make_dialer: MakeDialer, target: Target
) -> None:
    relay = await start_relay()
    dialer = await make_dialer(relay.ws_url(), target.url, allowed_path_prefixes=["/rollout/abc/v1"])
    async with httpx.AsyncClient(timeout=20) as client:
        allowed = await client.post(f"{relay.base}/rollout/abc/v1/chat/completions", json={"events": 1})
        sibling = await client.post(f"{relay.base}/rollout/abcd/v1/chat/completions", json={"events": 1})
        other = await client.get(f"{relay.base}/headers")
        dialer.allow_path_prefix("/headers")
        later = await client.get(f"{relay.base}/headers")
    assert allowed.status_code == 200
    assert sibling.status_code == 403 and other.status_code == 403
    assert sibling.json()["error"]["type"] == "relay_forbidden"
    assert later.status_code == 200


async def test_an_unreachable_target_is_a_retryable_502(start_relay: StartRelay, make_dialer: MakeDialer) -> None:
    relay = await start_relay()
    await make_dialer(relay.ws_url(), "http://127.0.0.1:9")  # discard port: nothing listens
    async with httpx.AsyncClient(timeout=20) as client:
        reply = await client.get(f"{relay.base}/anything")
    assert reply.status_code == 502
    assert "ConnectError" in reply.json()["error"]["message"]


async def test_credentials_are_re_read_at_every_connect(
    start_relay: StartRelay, target: Target, cuttable: MakeCuttable,
    eventually: Eventually,
) -> None:
    relay = await start_relay("--token-env", "RELAY_TOKEN", env={**os.environ, "RELAY_TOKEN": "tok-1"})
    path = await cuttable(relay.ws_port)
    reads: list[int] = []

    def headers() -> dict[str, str]:
        reads.append(1)
        return {"x-relay-token": "tok-1", "Authorization": f"Bearer rotating-{len(reads)}"}

    dialer = RelayDialer(lambda: relay.ws_url(path.port), headers, target.url, backoff_initial_s=0.05)
    async with dialer:
        await dialer.wait_connected(10)
        assert len(reads) == 1
        path.sever()
        await eventually(lambda: dialer.stats.connects == 2)
        assert len(reads) == 2


async def test_wait_connected_reports_the_last_error(make_dialer: MakeDialer, target: Target) -> None:
    dialer = await make_dialer("ws://127.0.0.1:9/relay", target.url, connect=False)
    with pytest.raises(RelayUnavailableError, match="ConnectionRefusedError|OSError"):
        await dialer.wait_connected(0.5)


async def test_the_dialer_notices_a_silent_relay_and_recovers(
    start_relay: StartRelay, make_dialer: MakeDialer, target: Target, eventually: Eventually
) -> None:
    relay = await start_relay()
    dialer = await make_dialer(relay.ws_url(), target.url, ping_interval_s=0.2, open_timeout_s=0.5)
    os.kill(relay.process.pid, signal.SIGSTOP)  # the relay stops answering, its socket stays open
    try:
        await eventually(lambda: dialer.stats.disconnects == 1, 5)
        assert dialer.stats.last_error is not None
    finally:
        os.kill(relay.process.pid, signal.SIGCONT)
    await eventually(lambda: dialer.connected, 10)
    async with httpx.AsyncClient(timeout=20) as client:
        assert (await client.post(f"{relay.base}/echo", content=b"x")).content == b"x"


async def test_no_credential_reaches_a_log(
    start_relay: StartRelay, make_dialer: MakeDialer, target: Target, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secrets_used = ["sk-AGENT-5150", "hf_BEARER-0042", "sbx-TOKEN-7777", "xak-KEY-3131"]
    relay = await start_relay("--log-level", "DEBUG")
    await make_dialer(relay.ws_url(), target.url,
                      headers={"Authorization": f"Bearer {secrets_used[1]}", "X-Sandbox-Token": secrets_used[2]})
    async with httpx.AsyncClient(timeout=20) as client:
        reply = await client.post(f"{relay.base}/rollout/s/v1/chat/completions", json={"events": 1},
                                  headers={"Authorization": f"Bearer {secrets_used[0]}", "x-api-key": secrets_used[3]})
    assert reply.status_code == 200 and target.state.last_headers["x-api-key"] == secrets_used[3]
    relay_log = relay.log_text()
    assert "[redacted]" in relay_log, "the relay logged headers at DEBUG (redacted)"
    assert any("Authorization" in r.getMessage() and "[redacted]" in r.getMessage() for r in caplog.records), \
        "the handshake headers were logged at DEBUG (redacted)"
    for secret in secrets_used:
        assert secret not in relay_log
        assert secret not in caplog.text
