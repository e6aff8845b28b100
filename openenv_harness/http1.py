"""HTTP/1.1 reply framing as uvicorn writes it, for the protocols that answer without an ASGI cycle.

Why here: the recorder's agent-call protocol (``recorder/edge/agent_protocol.py``) and the reference engine's
lean-route protocol (``testing/engine/protocol.py``) both write replies straight to the transport,
and each must put on the wire exactly the bytes uvicorn's own request cycle would have written for
the same response (the clients, and the tests comparing both paths, cannot tell them apart). The
rules are uvicorn 0.3x's ``RequestResponseCycle.send``: the server's default headers first, then
the response's; ``connection: close`` appended when the connection is not kept alive (unless the
response already says close, which also ends keep-alive); ``transfer-encoding: chunked`` appended
when the response gives neither a length nor chunking (except for 204 and 304).
"""

from __future__ import annotations

import http
import urllib.parse
from collections.abc import Iterable
from typing import Any, NamedTuple

try:  # uvicorn[standard] brings it; the fast paths that call ``fast_path`` exist only with it
    import httptools
except ImportError:  # pragma: no cover -- httptools is a dependency of this package
    httptools = None


def status_line(status: int) -> bytes:
    """``HTTP/1.1 200 OK\\r\\n``; a status without a known phrase keeps the space and no phrase."""
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


STATUS_LINES = {status: status_line(status) for status in range(100, 600)}


class Head(NamedTuple):
    """A reply's head on the wire, and how the body after it is framed."""

    data: bytes
    chunked: bool
    keep_alive: bool


def response_head(status: int, headers: Iterable[tuple[bytes, bytes]], keep_alive: bool) -> Head:
    """The head uvicorn writes for ``status`` and ``headers`` (the server's default headers first),
    whether the body is chunked, and whether the connection stays open after the reply."""
    out = [STATUS_LINES.get(status) or status_line(status)]
    framed = chunked = says_close = False
    for name, value in headers:
        name = name.lower()
        if name == b"content-length" and not framed:
            framed = True
        elif name == b"transfer-encoding" and value.lower() == b"chunked":
            framed = chunked = True
        elif name == b"connection" and b"close" in [t.lower().strip() for t in value.split(b",")]:
            keep_alive, says_close = False, True
        out += [name, b": ", value, b"\r\n"]
    if not keep_alive and not says_close:
        out.append(b"connection: close\r\n")
    if not framed and status not in (204, 304):
        chunked = True
        out.append(b"transfer-encoding: chunked\r\n")
    out.append(b"\r\n")
    return Head(b"".join(out), chunked, keep_alive)


def chunk(data: bytes, last: bool = False) -> bytes:
    """One body part in chunked framing (nothing for an empty part), and the terminator if ``last``."""
    out = b"%x\r\n%s\r\n" % (len(data), data) if data else b""
    return out + b"0\r\n\r\n" if last else out


def fast_path(protocol: Any) -> tuple[bytes, str, bytes] | None:
    """``(raw path, path, query)`` of the request uvicorn's httptools ``protocol`` has just parsed the
    head of, when the protocol may answer it itself; None leaves it to uvicorn's ASGI cycle.

    Why one gate for both fast paths (the recorder's agent-call protocol, the reference engine's lean
    routes): only a plain POST qualifies -- no ``Expect: 100-continue``, no upgrade, not pipelined
    behind a request still being answered (uvicorn queues those in order) -- and the path is
    percent-decoded as uvicorn would decode it for the app.
    """
    parser = protocol.parser
    if parser.get_method() != b"POST" or protocol.expect_100_continue or parser.should_upgrade():
        return None
    if protocol.cycle is not None and not protocol.cycle.response_complete:
        return None
    url = getattr(protocol, "url", None)  # uvicorn sets it per request, in on_message_begin
    if not isinstance(url, bytes):
        return None
    parsed = httptools.parse_url(url)
    raw_path = parsed.path
    path = raw_path.decode("ascii")
    if "%" in path:
        path = urllib.parse.unquote(path)
    return raw_path, path, parsed.query or b""
