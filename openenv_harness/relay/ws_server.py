"""The server side of RFC 6455 WebSockets, standard library only, for the in-sandbox relay.

Why write one: the relay must run on any image that has ``python3`` and nothing else, and it should
be short enough to audit in one sitting. It needs only what the relay uses: the opening handshake,
binary messages (fragmented or not), ping/pong and the closing handshake. No extensions are
negotiated (so clients never compress) and no subprotocols.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import struct
from collections.abc import Mapping
from typing import Protocol

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

OP_CONTINUATION = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_UNSUPPORTED = 1003
CLOSE_TOO_BIG = 1009


class WebSocketClosed(Exception):
    """The connection ended (closing handshake, peer gone, or a protocol violation)."""

    def __init__(self, code: int, reason: str = "") -> None:
        super().__init__(f"websocket closed ({code}{': ' + reason if reason else ''})")
        self.code = code
        self.reason = reason


class ByteReader(Protocol):
    """Where frames are read from: a ``StreamReader``, or the buffered reader that parsed the
    upgrade request (so bytes that arrived right behind it are not lost)."""

    async def readexactly(self, n: int) -> bytes: ...


def accept_key(client_key: str) -> str:
    """The ``Sec-WebSocket-Accept`` value for a client's ``Sec-WebSocket-Key``."""
    digest = hashlib.sha1(client_key.encode("ascii") + _GUID).digest()
    return base64.b64encode(digest).decode("ascii")


def upgrade_problem(method: str, headers: Mapping[str, str]) -> str | None:
    """Why this request is not a valid WebSocket opening handshake, or ``None`` if it is.

    ``headers`` maps lower-case names to values.
    """
    if method != "GET":
        return "a WebSocket handshake must use GET"
    if "websocket" not in headers.get("upgrade", "").lower():
        return "missing 'Upgrade: websocket'"
    if "upgrade" not in [t.strip() for t in headers.get("connection", "").lower().split(",")]:
        return "missing 'Connection: Upgrade'"
    if headers.get("sec-websocket-version", "").strip() != "13":
        return "only WebSocket version 13 is supported"
    key = headers.get("sec-websocket-key", "").strip()
    try:
        if len(base64.b64decode(key, validate=True)) != 16:
            return "Sec-WebSocket-Key must encode 16 bytes"
    except ValueError:
        return "Sec-WebSocket-Key is not base64"
    return None


def handshake_response(client_key: str) -> bytes:
    """The ``101 Switching Protocols`` answer that completes the opening handshake."""
    return (
        "HTTP/1.1 101 Switching Protocols\r\n"
        "Upgrade: websocket\r\n"
        "Connection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {accept_key(client_key.strip())}\r\n"
        "\r\n"
    ).encode("ascii")


def _unmask(payload: bytes, mask: bytes) -> bytes:
    """XOR the payload with the repeating 4-byte mask, as one big-integer operation (fast in C)."""
    if not payload:
        return payload
    n = len(payload)
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


def _frame_header(opcode: int, length: int) -> bytes:
    first = 0x80 | opcode
    if length < 126:
        return struct.pack(">BB", first, length)
    if length < 1 << 16:
        return struct.pack(">BBH", first, 126, length)
    return struct.pack(">BBQ", first, 127, length)


class ServerWebSocket:
    """An accepted WebSocket: receive whole binary messages, send binary messages.

    Control frames are handled inside ``receive``: pings are answered, the closing handshake is
    completed. A text message is refused (code 1003): the relay speaks binary frames only.
    """

    def __init__(self, reader: ByteReader, writer: asyncio.StreamWriter, *, max_message_bytes: int) -> None:
        self._reader = reader
        self._writer = writer
        self._max = max_message_bytes
        self._close_sent = False
        self.closed = False

    async def receive(self) -> bytes:
        """The next complete binary message; raises ``WebSocketClosed`` when the connection ends."""
        parts: list[bytes] = []
        size = 0
        fragmented_opcode: int | None = None
        while True:
            try:
                opcode, fin, payload = await self._read_frame()
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                self.closed = True
                raise WebSocketClosed(CLOSE_GOING_AWAY, "peer went away") from exc
            if opcode >= OP_CLOSE:
                await self._control(opcode, payload)
                continue
            if opcode == OP_CONTINUATION:
                if fragmented_opcode is None:
                    await self._fail(CLOSE_PROTOCOL_ERROR, "continuation without a message")
            elif fragmented_opcode is not None:
                await self._fail(CLOSE_PROTOCOL_ERROR, "new message inside a fragmented one")
            else:
                fragmented_opcode = opcode
            size += len(payload)
            if size > self._max:
                await self._fail(CLOSE_TOO_BIG, f"message over {self._max} bytes")
            parts.append(payload)
            if fin:
                if fragmented_opcode != OP_BINARY:
                    await self._fail(CLOSE_UNSUPPORTED, "only binary messages are accepted")
                return parts[0] if len(parts) == 1 else b"".join(parts)

    async def send(self, message: bytes) -> None:
        """Send one binary message (unfragmented; servers never mask)."""
        await self._send_frame(OP_BINARY, message)

    async def ping(self, payload: bytes = b"") -> None:
        await self._send_frame(OP_PING, payload[:125])

    async def close(self, code: int = CLOSE_NORMAL, reason: str = "") -> None:
        """Start (or finish) the closing handshake, then drop the connection."""
        if not self._close_sent and not self.closed:
            self._close_sent = True
            try:
                await self._send_frame(OP_CLOSE, struct.pack(">H", code) + reason.encode()[:120], force=True)
            except (ConnectionError, RuntimeError):
                pass
        self.abort()

    def abort(self) -> None:
        """Drop the connection at once."""
        self.closed = True
        transport = self._writer.transport
        if not transport.is_closing():
            transport.abort()

    async def _read_frame(self) -> tuple[int, bool, bytes]:
        first, second = await self._reader.readexactly(2)
        fin = bool(first & 0x80)
        opcode = first & 0x0F
        if first & 0x70:
            await self._fail(CLOSE_PROTOCOL_ERROR, "reserved bits set without an extension")
        if opcode not in (OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG):
            await self._fail(CLOSE_PROTOCOL_ERROR, f"unknown opcode {opcode}")
        if not second & 0x80:
            await self._fail(CLOSE_PROTOCOL_ERROR, "client frames must be masked")
        length = second & 0x7F
        if length == 126:
            (length,) = struct.unpack(">H", await self._reader.readexactly(2))
        elif length == 127:
            (length,) = struct.unpack(">Q", await self._reader.readexactly(8))
        if opcode >= OP_CLOSE and (length > 125 or not fin):
            await self._fail(CLOSE_PROTOCOL_ERROR, "control frames must be short and unfragmented")
        if length > self._max:
            await self._fail(CLOSE_TOO_BIG, f"frame over {self._max} bytes")
        mask = await self._reader.readexactly(4)
        payload = await self._reader.readexactly(length)
        return opcode, fin, _unmask(payload, mask)

    async def _control(self, opcode: int, payload: bytes) -> None:
        if opcode == OP_PING:
            await self._send_frame(OP_PONG, payload)
        elif opcode == OP_CLOSE:
            code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else CLOSE_NORMAL
            reason = payload[2:].decode("utf-8", "replace")
            if not self._close_sent:
                self._close_sent = True
                try:
                    await self._send_frame(OP_CLOSE, payload[:2], force=True)
                except (ConnectionError, RuntimeError):
                    pass
            self.abort()
            raise WebSocketClosed(code, reason)

    async def _fail(self, code: int, reason: str) -> None:
        await self.close(code, reason)
        raise WebSocketClosed(code, reason)

    async def _send_frame(self, opcode: int, payload: bytes, *, force: bool = False) -> None:
        if self.closed or (self._close_sent and not force):
            raise WebSocketClosed(CLOSE_GOING_AWAY, "connection is closed")
        self._writer.write(_frame_header(opcode, len(payload)) + payload)
        await self._writer.drain()
