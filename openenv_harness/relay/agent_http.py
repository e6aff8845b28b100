"""HTTP/1.1 for the agent's side of the in-sandbox relay, standard library only.

Why hand-written: the relay runs on bare images (``python3`` and nothing else) and must handle
exactly what agent SDKs send -- keep-alive connections, ``Content-Length`` or ``chunked`` request
bodies, ``Expect: 100-continue`` -- and stream replies back as they arrive. That is a small,
well-defined subset, parsed strictly: ambiguous framing is refused rather than guessed at.
"""

from __future__ import annotations

import asyncio
import http
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

MAX_HEAD_BYTES = 64 * 1024
LAST_CHUNK = b"0\r\n\r\n"


class HttpError(Exception):
    """A request the relay refuses; ``status`` is what the agent is told."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class AgentReader:
    """A ``StreamReader`` with its own buffer and push-back.

    Why: while a reply is pending the relay reads ahead to notice an agent that hung up; if what
    it read turns out to start a pipelined request it must not be lost.
    """

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._buffer = bytearray()

    def push_back(self, data: bytes) -> None:
        self._buffer[:0] = data

    async def read(self, limit: int) -> bytes:
        """Up to ``limit`` bytes as soon as any are available (``b""`` at end of stream)."""
        if self._buffer:
            data = bytes(self._buffer[:limit])
            del self._buffer[:limit]
            return data
        return await self._reader.read(limit)

    async def readexactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            data = await self._reader.read(max(size - len(self._buffer), 65536))
            if not data:
                raise asyncio.IncompleteReadError(bytes(self._buffer), size)
            self._buffer += data
        result = bytes(self._buffer[:size])
        del self._buffer[:size]
        return result

    async def readline(self, limit: int) -> bytes:
        """One CRLF-terminated line (terminator included); ``HttpError`` past ``limit`` bytes."""
        start = 0
        while True:
            index = self._buffer.find(b"\n", start)
            if index >= 0:
                if index == 0 or self._buffer[index - 1] != 0x0D:
                    raise HttpError(400, "bare LF in request framing")
                line = bytes(self._buffer[: index + 1])
                del self._buffer[: index + 1]
                return line
            if len(self._buffer) >= limit:
                raise HttpError(431, "request head too large")
            start = len(self._buffer)
            data = await self._reader.read(65536)
            if not data:
                partial = bytes(self._buffer)
                self._buffer.clear()
                raise asyncio.IncompleteReadError(partial, None)
            self._buffer += data


@dataclass
class AgentRequest:
    """A parsed request head."""

    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def header(self, name: str) -> str | None:
        """The last value of a header (``name`` in lower case), or ``None``."""
        found = None
        for key, value in self.headers:
            if key.lower() == name:
                found = value
        return found

    @property
    def keep_alive(self) -> bool:
        tokens = [t.strip().lower() for t in (self.header("connection") or "").split(",")]
        if self.version == "HTTP/1.0":
            return "keep-alive" in tokens
        return "close" not in tokens

    @property
    def expects_continue(self) -> bool:
        return (self.header("expect") or "").lower() == "100-continue"

    def body_length(self) -> int | None:
        """Declared body size, or ``None`` for a chunked body. Refuses ambiguous framing."""
        encodings = [v for k, v in self.headers if k.lower() == "transfer-encoding"]
        lengths = {v.strip() for k, v in self.headers if k.lower() == "content-length"}
        if encodings:
            if lengths:
                raise HttpError(400, "both Content-Length and Transfer-Encoding given")
            codings = [t.strip().lower() for v in encodings for t in v.split(",")]
            if codings != ["chunked"]:
                raise HttpError(501, f"unsupported transfer coding {', '.join(codings)!r}")
            return None
        if not lengths:
            return 0
        if len(lengths) > 1:
            raise HttpError(400, "conflicting Content-Length headers")
        value = lengths.pop()
        if not value.isdigit():
            raise HttpError(400, "malformed Content-Length")
        return int(value)


async def read_request_head(reader: AgentReader) -> AgentRequest | None:
    """The next request head, or ``None`` if the agent closed the connection between requests."""
    line = b"\r\n"
    read = 0
    try:
        while line == b"\r\n":  # tolerate blank lines before a request (RFC 9112 section 2.2)
            line = await reader.readline(MAX_HEAD_BYTES)
            read += len(line)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise HttpError(400, "connection closed inside a request line") from None
    parts = line[:-2].decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[0].isupper():
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(505, f"unsupported protocol version {version!r}")
    if not target.startswith("/"):
        raise HttpError(400, "only origin-form request targets are accepted")
    headers: list[tuple[str, str]] = []
    while True:
        try:
            raw = await reader.readline(MAX_HEAD_BYTES - read)
        except asyncio.IncompleteReadError:
            raise HttpError(400, "connection closed inside the request head") from None
        read += len(raw)
        if read > MAX_HEAD_BYTES:
            raise HttpError(431, "request head too large")
        if raw == b"\r\n":
            break
        if raw[:1] in (b" ", b"\t"):
            raise HttpError(400, "obsolete header line folding")
        name, sep, value = raw[:-2].decode("latin-1").partition(":")
        if not sep or not name or name != name.strip() or any(c in name for c in " \t"):
            raise HttpError(400, "malformed header line")
        headers.append((name, value.strip()))
    return AgentRequest(method, target, version, headers)


async def iter_body(
    reader: AgentReader, request: AgentRequest, *, piece: int, max_bytes: int
) -> AsyncIterator[bytes]:
    """The request body in pieces of at most ``piece`` bytes, as they arrive."""
    length = request.body_length()
    total = 0
    if length is not None:
        if length > max_bytes:
            raise HttpError(413, f"request body over {max_bytes} bytes")
        remaining = length
        while remaining:
            data = await reader.read(min(remaining, piece))
            if not data:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(data)
            yield data
        return
    while True:
        size_line = await reader.readline(1024)
        size_text = size_line[:-2].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise HttpError(400, "malformed chunk size") from None
        if size == 0:
            while await reader.readline(MAX_HEAD_BYTES) != b"\r\n":  # trailers: read and drop
                pass
            return
        total += size
        if total > max_bytes:
            raise HttpError(413, f"request body over {max_bytes} bytes")
        remaining = size
        while remaining:
            data = await reader.read(min(remaining, piece))
            if not data:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(data)
            yield data
        if await reader.readexactly(2) != b"\r\n":
            raise HttpError(400, "chunk not followed by CRLF")


def response_head(status: int, headers: list[tuple[str, str]], *, version: str = "HTTP/1.1") -> bytes:
    """A status line and header block."""
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = "Status"
    lines = [f"{version} {status} {reason}"] + [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def encode_chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (never the terminating one)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def error_response(status: int, message: str, *, kind: str, retry_after_s: int | None = None) -> bytes:
    """A complete OpenAI-shaped JSON error reply that closes the connection."""
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    headers = [
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
    ]
    if retry_after_s is not None:
        headers.append(("Retry-After", str(retry_after_s)))
    return response_head(status, headers) + body
