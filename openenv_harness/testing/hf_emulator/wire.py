"""HTTP/1.1 plumbing for the emulator, shaped like the real in-job server's.

Why hand-rolled rather than an ASGI app: the port proxy must take over the raw socket after
reading a request head (a real byte splice, as sbx-server does), and the real server's framing
rules -- keep-alive, ``Content-Length`` only, chunked request bodies refused with 411 -- are part
of what the emulator reproduces.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

HEAD_LIMIT = 64 * 1024
_REASONS = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 409: "Conflict", 411: "Length Required", 413: "Payload Too Large",
    500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
}


class HttpFailure(Exception):
    """Answer the current request with ``status`` and ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Request:
    """A request head plus the connection it arrived on."""

    method: str
    target: str
    raw_headers: list[tuple[str, str]]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    path: str = ""
    query: dict[str, list[str]] = field(default_factory=dict)
    query_string: str = ""

    def __post_init__(self) -> None:
        parts = urlsplit(self.target)
        self.path, self.query_string = parts.path, parts.query
        self.query = parse_qs(parts.query, keep_blank_values=True)

    def header(self, name: str) -> str | None:
        for key, value in reversed(self.raw_headers):
            if key.lower() == name:
                return value
        return None

    def param(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else default

    @property
    def keep_alive(self) -> bool:
        return (self.header("connection") or "").lower() != "close"

    def content_length(self) -> int:
        """Declared body size; a chunked body is refused, as sbx-server does."""
        if self.header("transfer-encoding") is not None:
            raise HttpFailure(411, "chunked request bodies are not supported; send Content-Length")
        value = self.header("content-length")
        if value is None:
            return 0
        if not value.strip().isdigit():
            raise HttpFailure(400, "malformed Content-Length")
        return int(value)

    async def body(self) -> bytes:
        length = self.content_length()
        return await self.reader.readexactly(length) if length else b""

    async def json(self) -> Any:
        try:
            return json.loads(await self.body() or b"null")
        except ValueError:
            raise HttpFailure(400, "body is not JSON") from None


async def read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Request | None:
    """The next request head on a connection, or ``None`` when the client closed it."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    except asyncio.LimitOverrunError:
        raise HttpFailure(400, "request head too large") from None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpFailure(400, "malformed request line")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise HttpFailure(400, "malformed header line")
        headers.append((name.strip(), value.strip()))
    return Request(parts[0], parts[1], headers, reader, writer)


def response(status: int, body: bytes, *, content_type: str = "application/json", close: bool = False) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
    ]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def json_response(status: int, value: Any, *, close: bool = False) -> bytes:
    return response(status, json.dumps(value).encode(), close=close)


def error_response(status: int, message: str, *, close: bool = False) -> bytes:
    return json_response(status, {"error": message}, close=close)


def chunked_head(status: int, content_type: str) -> bytes:
    return (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\nContent-Type: {content_type}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"
