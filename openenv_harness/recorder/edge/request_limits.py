"""Bounds on a request before anything reads it: its head's size, its header count, and the time
its head and its body take to arrive.

Why: any client that can connect reaches the HTTP parser before authentication. Without a bound a
128 MiB header on the liveness probe stalled the event loop for seconds (the parser accumulates a
header in pieces) and a connection that sent one byte a minute held its request open forever. The
recorder's protocol (``edge/agent_protocol.py``) applies these limits on every route as bytes arrive; the
ASGI app (``app.py``) checks what reaches it under any other server. The answers:

* 431 when the request line and headers exceed ``max_header_bytes`` or there are more than
  ``max_header_count`` header fields; the connection is then closed;
* 408 when a head is not complete ``request_head_timeout_s`` after its first byte (or after the
  connection opened), or a body ``request_body_timeout_s`` after its head; the connection is then
  closed. A connection that never sent a byte is closed without an answer.

Both come in the OpenAI error shape with ``connection: close``.
"""

from __future__ import annotations

import http
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from openenv_harness.recorder.context import RecorderConfig
from openenv_harness.recorder.errors import AgentError, error_body

#: Bytes a request line adds to its method and target: " " + " HTTP/1.1\r\n".
_LINE_OVERHEAD = 12
#: Bytes a header line adds to its name and value: ": " and "\r\n".
_HEADER_OVERHEAD = 4


def _default(name: str) -> Any:
    return RecorderConfig.model_fields[name].default


@dataclass(frozen=True)
class RequestLimits:
    """The four bounds, from a recorder's configuration (the defaults for any other app)."""

    max_header_bytes: int = _default("max_header_bytes")
    max_header_count: int = _default("max_header_count")
    head_timeout_s: float = _default("request_head_timeout_s")
    body_timeout_s: float = _default("request_body_timeout_s")

    @classmethod
    def of(cls, config: RecorderConfig | None) -> RequestLimits:
        if config is None:
            return cls()
        return cls(config.max_header_bytes, config.max_header_count, config.request_head_timeout_s,
                   config.request_body_timeout_s)


def head_too_large(limit: int) -> AgentError:
    return AgentError(431, f"request line and headers exceed {limit} bytes", code="header_too_large",
                      headers={"connection": "close"})


def too_many_headers(limit: int) -> AgentError:
    return AgentError(431, f"request has more than {limit} header fields", code="too_many_headers",
                      headers={"connection": "close"})


def request_timeout(part: str, seconds: float) -> AgentError:
    return AgentError(408, f"the request's {part} did not arrive within {seconds:g} s", code="request_timeout",
                      headers={"connection": "close"})


def check_head(method: bytes | str, target_bytes: int, headers: Iterable[tuple[bytes, bytes]],
               limits: RequestLimits) -> AgentError | None:
    """The 431 a parsed head deserves, or None. ``target_bytes``: the request target's length."""
    count = 0
    size = len(method) + target_bytes + _LINE_OVERHEAD
    for name, value in headers:
        count += 1
        size += len(name) + len(value) + _HEADER_OVERHEAD
    if count > limits.max_header_count:
        return too_many_headers(limits.max_header_count)
    if size > limits.max_header_bytes:
        return head_too_large(limits.max_header_bytes)
    return None


def check_scope(scope: dict[str, Any], limits: RequestLimits) -> AgentError | None:
    """``check_head`` for an ASGI scope (what another server already parsed)."""
    target = len(scope.get("raw_path") or scope["path"].encode()) + len(scope.get("query_string") or b"") + 1
    return check_head(scope.get("method", "GET"), target, scope["headers"], limits)


def raw_response(error: AgentError, default_headers: Iterable[tuple[bytes, bytes]] = ()) -> bytes:
    """The error as the bytes of one HTTP/1.1 response that closes the connection (for the protocol,
    which answers before any ASGI cycle exists)."""
    body = orjson.dumps(error_body(error.message, type=error.type, code=error.code))
    try:
        phrase = http.HTTPStatus(error.status).phrase
    except ValueError:
        phrase = ""
    out = [f"HTTP/1.1 {error.status} {phrase}\r\n".encode("latin-1")]
    for name, value in default_headers:
        out += [name, b": ", value, b"\r\n"]
    out.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body))
    out.append(body)
    return b"".join(out)
