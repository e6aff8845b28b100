"""Raw-socket HTTP for tests that send what no HTTP client would: oversized or endless heads, lying
``Content-Length``, bodies that never arrive, garbage framing.

``exchange`` writes the pieces (stopping quietly if the server closes or resets the connection
meanwhile, as it may once it has refused the request), then reads what comes back: every complete
reply, and whether the server closed the connection. It never asserts anything itself.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class Outcome:
    replies: list[Reply] = field(default_factory=list)
    closed: bool = False  #: the server closed (or reset) the connection
    reset: bool = False  #: ... with a reset
    leftover: bytes = b""  #: bytes after the last complete reply (a reply cut short, or garbage)

    @property
    def status(self) -> int | None:
        return self.replies[0].status if self.replies else None

    @property
    def statuses(self) -> list[int]:
        return [r.status for r in self.replies]


def _parse(data: bytes, bodiless: bool = False) -> tuple[list[Reply], bytes]:
    replies: list[Reply] = []
    while b"\r\n\r\n" in data:
        head, rest = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split()[1])
        except (IndexError, ValueError):
            break
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = 0 if bodiless else int(headers.get("content-length", "0"))
        if len(rest) < length:
            break
        replies.append(Reply(status, headers, rest[:length]))
        data = rest[length:]
    return replies, data


def exchange(host: str, port: int, pieces: bytes | list[bytes], *, replies: int = 1, until_closed: bool = False,
             pause_s: float = 0.0, read_timeout_s: float = 30.0, half_close: bool = False,
             bodiless: bool = False) -> Outcome:
    """Send ``pieces`` (``pause_s`` apart; with ``half_close`` the sending side is then shut), then read
    until ``replies`` replies are complete (and, with ``until_closed``, until the server closes), the
    server closes, or ``read_timeout_s`` passes without a byte."""
    if isinstance(pieces, bytes):
        pieces = [pieces]
    outcome = Outcome()
    with socket.create_connection((host, port), timeout=read_timeout_s) as sock:
        for i, piece in enumerate(pieces):
            if i and pause_s:
                time.sleep(pause_s)
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break  # the server refused and closed: what it answered is still to be read
        if half_close:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        data = b""
        while True:
            got, _ = _parse(data, bodiless)
            if len(got) >= replies and not until_closed:
                break
            try:
                more = sock.recv(1 << 16)
            except ConnectionResetError:
                outcome.closed = outcome.reset = True
                break
            except socket.timeout:
                break
            if not more:
                outcome.closed = True
                break
            data += more
        outcome.replies, outcome.leftover = _parse(data, bodiless)
    return outcome


def request(method: str, path: str, headers: list[tuple[str, str]] | None = None, body: bytes = b"",
            *, content_length: int | None = None, version: str = "1.1") -> bytes:
    """One request's bytes: ``content_length`` overrides the true length (to lie about it)."""
    lines = [f"{method} {path} HTTP/{version}", "host: recorder"]
    lines += [f"{name}: {value}" for name, value in headers or []]
    if body or content_length is not None:
        lines.append(f"content-length: {len(body) if content_length is None else content_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
