"""The relay's own RFC 6455 server side, against raw sockets and the ``websockets`` client."""

from __future__ import annotations

import asyncio
import base64
import os
import struct
from collections.abc import AsyncIterator

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from openenv_harness.relay.agent_http import AgentReader, read_request_head
from openenv_harness.relay.ws_server import (
    ServerWebSocket,
    WebSocketClosed,
    accept_key,
    handshake_response,
    upgrade_problem,
)


def test_accept_key_matches_the_rfc_example() -> None:
    assert accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


@pytest.mark.parametrize(
    "method, headers, problem",
    [
        ("POST", {}, "GET"),
        ("GET", {"connection": "Upgrade"}, "Upgrade: websocket"),
        ("GET", {"upgrade": "websocket", "connection": "keep-alive"}, "Connection: Upgrade"),
        ("GET", {"upgrade": "websocket", "connection": "Upgrade", "sec-websocket-version": "8"}, "version 13"),
        ("GET", {"upgrade": "websocket", "connection": "keep-alive, Upgrade", "sec-websocket-version": "13",
                 "sec-websocket-key": "!!"}, "base64"),
        ("GET", {"upgrade": "websocket", "connection": "Upgrade", "sec-websocket-version": "13",
                 "sec-websocket-key": base64.b64encode(b"short").decode()}, "16 bytes"),
    ],
)
def test_bad_handshakes_are_named(method: str, headers: dict[str, str], problem: str) -> None:
    assert problem in (upgrade_problem(method, headers) or "")


class EchoServer:
    """Accepts one WebSocket per connection and echoes binary messages; records close codes."""

    def __init__(self) -> None:
        self.closes: list[WebSocketClosed] = []
        self.port = 0

    async def handle(self, raw: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reader = AgentReader(raw)
        request = await read_request_head(reader)
        assert request is not None
        writer.write(handshake_response(request.header("sec-websocket-key") or ""))
        ws = ServerWebSocket(reader, writer, max_message_bytes=1 << 20)
        try:
            while True:
                await ws.send(await ws.receive())
        except WebSocketClosed as closed:
            self.closes.append(closed)


@pytest.fixture
async def echo() -> AsyncIterator[EchoServer]:
    server_state = EchoServer()
    server = await asyncio.start_server(server_state.handle, "127.0.0.1", 0)
    server_state.port = server.sockets[0].getsockname()[1]
    yield server_state
    server.close()


async def test_websockets_client_round_trips_binary_messages_of_all_sizes(echo: EchoServer) -> None:
    async with connect(f"ws://127.0.0.1:{echo.port}/", compression=None, max_size=2 << 20) as ws:
        for size in (0, 1, 125, 126, 65535, 65536, 700_000):
            payload = os.urandom(size)
            await ws.send(payload)
            assert await ws.recv() == payload
        latency = await ws.ping()
        await asyncio.wait_for(latency, 2)  # the server answered the control ping with a pong


async def test_fragmented_messages_are_reassembled(echo: EchoServer) -> None:
    async with connect(f"ws://127.0.0.1:{echo.port}/", compression=None) as ws:
        await ws.send([b"ab", b"cd", b"ef"])  # an iterable is sent as one fragmented message
        assert await ws.recv() == b"abcdef"


async def test_text_messages_are_refused_with_1003(echo: EchoServer) -> None:
    async with connect(f"ws://127.0.0.1:{echo.port}/", compression=None) as ws:
        await ws.send("text")
        with pytest.raises(ConnectionClosed) as info:
            await ws.recv()
    assert info.value.rcvd is not None and info.value.rcvd.code == 1003


async def _raw_upgrade(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\r\n".encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101") and accept_key(key).encode() in head
    return reader, writer


async def test_frames_sent_right_behind_the_upgrade_request_are_not_lost(echo: EchoServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", echo.port)
    key = base64.b64encode(os.urandom(16)).decode()
    mask = b"\x01\x02\x03\x04"
    payload = b"early"
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    writer.write(  # the upgrade and a first frame in one write, before any answer
        f"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\r\n".encode()
        + struct.pack(">BB", 0x82, 0x80 | len(payload)) + mask + masked
    )
    await reader.readuntil(b"\r\n\r\n")
    echoed = await asyncio.wait_for(reader.readexactly(2 + len(payload)), 2)
    assert echoed == struct.pack(">BB", 0x82, len(payload)) + payload
    writer.close()


async def test_unmasked_client_frames_are_a_protocol_error(echo: EchoServer) -> None:
    reader, writer = await _raw_upgrade(echo.port)
    writer.write(struct.pack(">BB", 0x82, 3) + b"abc")  # binary, FIN, *no mask*
    close = await asyncio.wait_for(reader.read(64), 2)
    assert close[0] == 0x88 and struct.unpack(">H", close[2:4])[0] == 1002
    writer.close()
    await asyncio.sleep(0.05)
    assert echo.closes and echo.closes[-1].code == 1002


async def test_oversized_messages_are_refused_with_1009(echo: EchoServer) -> None:
    reader, writer = await _raw_upgrade(echo.port)
    writer.write(struct.pack(">BBQ", 0x82, 0x80 | 127, (1 << 20) + 1) + b"\x00" * 4)
    close = await asyncio.wait_for(reader.read(64), 2)
    assert close[0] == 0x88 and struct.unpack(">H", close[2:4])[0] == 1009
    writer.close()
