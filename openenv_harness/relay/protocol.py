"""The relay's framing protocol: HTTP calls multiplexed over one WebSocket.

Why a protocol of our own: a remote sandbox can only be reached through the sandbox server's port
proxy, one WebSocket per connection, while the agent inside makes many HTTP calls -- concurrently,
with bodies of several MiB and with streamed (SSE) replies. So the in-sandbox relay turns every
agent call into a numbered *stream* of small frames on the single socket the trainer dialled in,
and the trainer-side dialer turns each stream back into an HTTP call to the recorder.

This module is **standard library only** and imports nothing else from the package: it is uploaded
next to ``sandbox_relay.py`` and imported there as a plain module, so both ends share one codec.

Frames
------
Every WebSocket *binary* message carries exactly one frame::

    offset 0     1                5
           +-----+----------------+------------------------+
           | kind| stream (u32 BE)| payload (rest of msg)  |
           +-----+----------------+------------------------+

``stream`` 0 is the connection itself; every agent call gets a fresh non-zero stream id chosen by
the relay. Frame kinds (``->`` is relay to trainer, ``<-`` trainer to relay):

==== =============== ===== ============================================================
kind name            dir   payload
==== =============== ===== ============================================================
0x01 HELLO           <-    JSON ``{"version", "window", "ping_interval_s"}``, stream 0, first
0x02 READY           ->    JSON ``{"version", "window"}``, stream 0, the answer to HELLO
0x03 PING            <->   up to 64 opaque bytes, stream 0; the receiver answers PONG
0x04 PONG            <->   the PING's bytes echoed
0x10 REQUEST_HEAD    ->    JSON ``{"method", "path", "headers": [[name, value], ...], "body"}``
0x11 REQUEST_BODY    ->    raw body bytes, at most ``MAX_CHUNK`` per frame
0x12 REQUEST_END     ->    empty: the agent's request body is complete
0x20 RESPONSE_HEAD   <-    JSON ``{"status", "headers": [[name, value], ...]}``
0x21 RESPONSE_BODY   <-    raw body bytes, at most ``MAX_CHUNK`` per frame
0x22 RESPONSE_END    <-    empty: the reply is complete
0x30 WINDOW          <->   u32 BE: more bytes the peer may send on this stream
0x31 CANCEL          ->    JSON ``{"reason"}``: the agent went away, stop the call
0x32 ERROR           <->   JSON ``{"status", "message"}``: the call failed
==== =============== ===== ============================================================

A call is ``REQUEST_HEAD, REQUEST_BODY*, REQUEST_END`` one way and ``RESPONSE_HEAD,
RESPONSE_BODY*, RESPONSE_END`` (or ``ERROR`` at any point) the other. Bodies are cut into pieces
of at most ``MAX_CHUNK`` bytes, so no message comes near the 1 MiB default frame limit of common
WebSocket libraries however large the body, and calls interleave fairly on the socket.

Flow control
------------
Each side announces a per-stream *window* (HELLO for request bodies, READY for response bodies):
the number of body bytes the other side may send on one stream before it must wait. The receiver
hands credit back with ``WINDOW`` frames once it has passed bytes on (the relay after the agent's
socket drained, the dialer after the recorder's upload took them), in batches of a quarter window
(at most ``window - MAX_CHUNK``, so a blocked sender is always unblocked). A slow agent therefore stops
the dialer reading from the recorder after one window, instead of making it buffer without bound.
Sending more than the granted credit is a protocol error that fails the stream.

Liveness and failure
--------------------
The dialer sends ``PING`` at least every 15 s (the sandbox proxy drops idle connections); either
side treats a silent peer (no frame for three intervals) as gone. When the socket drops, every
open call fails: before its response head the agent gets a retryable ``502``; after it, the agent's
connection is cut so the stream ends visibly incomplete. A call that arrives while no trainer is
connected waits briefly, then gets ``503`` with ``Retry-After``.

Secrets
-------
Calls carry the agent's bearer key and the WebSocket upgrade carries sandbox credentials. Neither
side logs header values of ``SECRET_HEADERS``; use ``redact_headers`` before logging headers.
"""

from __future__ import annotations

import asyncio
import enum
import json
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

PROTOCOL_VERSION = 1
#: Largest body piece in one frame. Small enough that calls interleave and any WebSocket library's
#: default message limit is never approached.
MAX_CHUNK = 64 * 1024
#: Default per-stream flow-control window, each direction.
DEFAULT_WINDOW = 1024 * 1024
#: Largest head (JSON) or control payload accepted.
MAX_HEAD_BYTES = 256 * 1024
#: Largest WebSocket message either side accepts: a head, or a body piece plus framing.
MAX_MESSAGE_BYTES = MAX_HEAD_BYTES + 1024
#: Keep-alive cadence the sandbox proxy needs (it drops connections idle for longer).
MAX_PING_INTERVAL_S = 15.0
DEFAULT_PING_INTERVAL_S = 10.0
#: Path the relay accepts the trainer's WebSocket on (the proxy strips its own prefix).
RELAY_WS_PATH = "/relay"
#: Header carrying the relay's own connection secret on the WebSocket upgrade.
RELAY_TOKEN_HEADER = "x-relay-token"

#: Headers whose values are credentials: never written to any log.
SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-sandbox-token",
        "x-api-key",
        "api-key",
        "cookie",
        "set-cookie",
        RELAY_TOKEN_HEADER,
    }
)
#: Connection-scoped headers (RFC 9110 section 7.6.1) that must not cross the relay.
HOP_BY_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "expect",
    }
)
REDACTED = "[redacted]"

_HEADER = struct.Struct(">BI")
_U32 = struct.Struct(">I")
_MAX_STREAM = 2**32 - 1

Headers = list[tuple[str, str]]


class ProtocolError(ValueError):
    """A frame or a frame sequence broke the protocol; the message says how."""


class FrameKind(enum.IntEnum):
    HELLO = 0x01
    READY = 0x02
    PING = 0x03
    PONG = 0x04
    REQUEST_HEAD = 0x10
    REQUEST_BODY = 0x11
    REQUEST_END = 0x12
    RESPONSE_HEAD = 0x20
    RESPONSE_BODY = 0x21
    RESPONSE_END = 0x22
    WINDOW = 0x30
    CANCEL = 0x31
    ERROR = 0x32


#: Frames that belong to the connection (stream 0) rather than to a call.
CONNECTION_KINDS = frozenset({FrameKind.HELLO, FrameKind.READY, FrameKind.PING, FrameKind.PONG})


@dataclass(frozen=True)
class Frame:
    """One decoded frame."""

    kind: FrameKind
    stream: int
    payload: bytes = b""

    def json(self) -> dict:
        """The payload as a JSON object (HELLO, READY, heads, CANCEL, ERROR)."""
        try:
            value = json.loads(self.payload)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"{self.kind.name} payload is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ProtocolError(f"{self.kind.name} payload must be a JSON object")
        return value

    def window_increment(self) -> int:
        """The credit a WINDOW frame grants."""
        if self.kind is not FrameKind.WINDOW or len(self.payload) != _U32.size:
            raise ProtocolError("WINDOW payload must be exactly 4 bytes")
        (increment,) = _U32.unpack(self.payload)
        if increment == 0:
            raise ProtocolError("WINDOW increment must be positive")
        return increment


def encode_frame(kind: FrameKind, stream: int, payload: bytes = b"") -> bytes:
    """Serialize one frame into the bytes of one WebSocket binary message."""
    if not 0 <= stream <= _MAX_STREAM:
        raise ProtocolError(f"stream id {stream} out of range")
    if kind in CONNECTION_KINDS and stream != 0:
        raise ProtocolError(f"{kind.name} frames travel on stream 0 only")
    if kind not in CONNECTION_KINDS and stream == 0:
        raise ProtocolError(f"{kind.name} frames need a non-zero stream id")
    limit = MAX_CHUNK if kind in (FrameKind.REQUEST_BODY, FrameKind.RESPONSE_BODY) else MAX_HEAD_BYTES
    if len(payload) > limit:
        raise ProtocolError(f"{kind.name} payload of {len(payload)} bytes exceeds {limit}")
    return _HEADER.pack(kind, stream) + payload


def decode_frame(message: bytes | bytearray | memoryview) -> Frame:
    """Parse one WebSocket binary message; raises ``ProtocolError`` on anything malformed."""
    data = bytes(message)
    if len(data) < _HEADER.size:
        raise ProtocolError(f"frame of {len(data)} bytes is shorter than its {_HEADER.size}-byte header")
    kind_value, stream = _HEADER.unpack_from(data)
    try:
        kind = FrameKind(kind_value)
    except ValueError:
        raise ProtocolError(f"unknown frame kind 0x{kind_value:02x}") from None
    payload = data[_HEADER.size :]
    if (kind in CONNECTION_KINDS) != (stream == 0):
        raise ProtocolError(f"{kind.name} frame on stream {stream}")
    limit = MAX_CHUNK if kind in (FrameKind.REQUEST_BODY, FrameKind.RESPONSE_BODY) else MAX_HEAD_BYTES
    if len(payload) > limit:
        raise ProtocolError(f"{kind.name} payload of {len(payload)} bytes exceeds {limit}")
    return Frame(kind, stream, payload)


def json_frame(kind: FrameKind, stream: int, value: dict) -> bytes:
    """A frame whose payload is a compact JSON object."""
    return encode_frame(kind, stream, json.dumps(value, separators=(",", ":")).encode())


def window_frame(stream: int, increment: int) -> bytes:
    """Grant ``increment`` more body bytes on ``stream``."""
    if not 0 < increment <= _MAX_STREAM:
        raise ProtocolError(f"WINDOW increment {increment} out of range")
    return encode_frame(FrameKind.WINDOW, stream, _U32.pack(increment))


def body_pieces(data: bytes, max_chunk: int = MAX_CHUNK) -> Iterator[bytes]:
    """Cut a body into frame-sized pieces (nothing for an empty body)."""
    view = memoryview(data)
    for start in range(0, len(view), max_chunk):
        yield bytes(view[start : start + max_chunk])


def _check_headers(value: object, what: str) -> Headers:
    if not isinstance(value, list):
        raise ProtocolError(f"{what} headers must be a list of [name, value] pairs")
    headers: Headers = []
    for item in value:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(x, str) for x in item)):
            raise ProtocolError(f"{what} header entries must be [name, value] string pairs")
        name, header_value = item
        if not name or any(c in name for c in " \t\r\n:") or any(c in header_value for c in "\r\n"):
            raise ProtocolError(f"{what} carries a malformed header")
        headers.append((name, header_value))
    return headers


@dataclass(frozen=True)
class RequestHead:
    """The agent's request line and headers (REQUEST_HEAD)."""

    method: str
    path: str
    headers: Headers
    #: Whether REQUEST_BODY frames may follow (``False`` for a request without any body, so the
    #: far side does not invent one; hop-by-hop framing headers do not cross the relay).
    has_body: bool = True

    def encode(self, stream: int) -> bytes:
        return json_frame(
            FrameKind.REQUEST_HEAD,
            stream,
            {
                "method": self.method,
                "path": self.path,
                "headers": [list(h) for h in self.headers],
                "body": self.has_body,
            },
        )

    @classmethod
    def decode(cls, frame: Frame) -> "RequestHead":
        value = frame.json()
        method, path = value.get("method"), value.get("path")
        if not isinstance(method, str) or not method.isalpha() or not method.isupper():
            raise ProtocolError("REQUEST_HEAD method must be an upper-case token")
        if not isinstance(path, str) or not path.startswith("/") or any(c in path for c in " \r\n"):
            raise ProtocolError("REQUEST_HEAD path must be an origin-form path starting with '/'")
        has_body = value.get("body")
        if not isinstance(has_body, bool):
            raise ProtocolError("REQUEST_HEAD body must be true or false")
        return cls(method, path, _check_headers(value.get("headers"), "REQUEST_HEAD"), has_body)


@dataclass(frozen=True)
class ResponseHead:
    """The status and headers of the target's reply (RESPONSE_HEAD)."""

    status: int
    headers: Headers

    def encode(self, stream: int) -> bytes:
        return json_frame(
            FrameKind.RESPONSE_HEAD, stream, {"status": self.status, "headers": [list(h) for h in self.headers]}
        )

    @classmethod
    def decode(cls, frame: Frame) -> "ResponseHead":
        value = frame.json()
        status = value.get("status")
        if not isinstance(status, int) or isinstance(status, bool) or not 200 <= status <= 599:
            raise ProtocolError("RESPONSE_HEAD status must be an integer in 200..599")
        return cls(status, _check_headers(value.get("headers"), "RESPONSE_HEAD"))


def forwardable_headers(headers: Iterable[tuple[str, str]], *, drop: Sequence[str] = ()) -> Headers:
    """Headers minus hop-by-hop ones (and those named in ``Connection``) and ``drop``."""
    pairs = list(headers)
    named = {
        token.strip().lower()
        for name, value in pairs
        if name.lower() == "connection"
        for token in value.split(",")
    }
    skip = HOP_BY_HOP_HEADERS | named | {d.lower() for d in drop}
    return [(name, value) for name, value in pairs if name.lower() not in skip]


def redact_headers(headers: Iterable[tuple[str, str]]) -> Headers:
    """A copy safe to log: credential-bearing header values are replaced."""
    return [(name, REDACTED if name.lower() in SECRET_HEADERS else value) for name, value in headers]


class StreamWindow:
    """Send credit for one stream: how many body bytes may still go out before the peer grants more.

    Why here and not in each end: both directions use the same accounting, and it is the core of
    the protocol's promise that a slow reader bounds what the sender holds.
    """

    def __init__(self, initial: int) -> None:
        if initial < MAX_CHUNK:
            raise ProtocolError(f"a window of {initial} bytes is below one body piece ({MAX_CHUNK})")
        self._credit = initial
        self._changed = asyncio.Event()
        self._failure: BaseException | None = None

    @property
    def credit(self) -> int:
        return self._credit

    def grant(self, increment: int) -> None:
        """Add credit the peer sent with a WINDOW frame."""
        self._credit += increment
        self._changed.set()

    def fail(self, error: BaseException) -> None:
        """Wake every waiter with ``error`` (the stream or the connection ended)."""
        self._failure = error
        self._changed.set()

    async def acquire(self, size: int) -> None:
        """Wait until ``size`` bytes may be sent, then take that much credit."""
        while True:
            if self._failure is not None:
                raise self._failure
            if self._credit >= size:
                self._credit -= size
                return
            self._changed.clear()
            await self._changed.wait()


class ReceiveWindow:
    """Receive-side accounting: checks the peer stays within its credit, and batches the credit
    handed back.

    Why batch: acknowledging every piece costs a frame each way for even the smallest call. Credit
    goes back once a quarter window has been passed on -- but never later than ``window -
    MAX_CHUNK`` bytes, so a sender blocked on its next (at most ``MAX_CHUNK``) piece always has
    enough outstanding bytes to trigger the grant that unblocks it.
    """

    def __init__(self, initial: int) -> None:
        self._allowed = initial
        self._unreported = 0
        self._batch = max(1, min(initial // 4, initial - MAX_CHUNK))

    def consume(self, size: int) -> None:
        """Account for a body piece that arrived; raises when it exceeds the granted credit."""
        if size > self._allowed:
            raise ProtocolError(f"peer sent {size} body bytes with only {self._allowed} bytes of credit")
        self._allowed -= size

    def release(self, size: int) -> int:
        """``size`` bytes were passed on; returns the WINDOW increment to send now (0: not yet)."""
        self._unreported += size
        if self._unreported < self._batch:
            return 0
        increment, self._unreported = self._unreported, 0
        self._allowed += increment
        return increment
