"""What an agent's JSON body may hold beyond being valid JSON: bounded nesting, exact integers.

Why: the recorder forwards the agent's body to the engine and stores it in the record, so a body
it accepts must survive both unchanged. Two things valid JSON allows do not:

* **deep nesting.** orjson parses up to 1,024 levels but serializes only 255, so a body nested a
  few hundred levels deep was parsed, sent to the engine as a serialization failure and answered
  with a 500. Bodies are refused past ``RecorderConfig.max_json_depth`` (64 by default; no agent
  body comes near it -- a tool schema is a dozen levels) with a 400 before anything else happens.
* **integers beyond 64 bits.** orjson reads an integer literal outside [-2**63, 2**64) as a float:
  ``123456789012345678901234567890`` would reach the engine as ``1.2345678901234568e+29``, a
  different body from the one the agent sent. Such a body is refused with a 400 naming where the
  integer is: the recorder never alters what an agent sent, and it cannot represent the number
  exactly (neither can the engine's own JSON parser, nor the agent SDKs').

One walk over the parsed containers checks both (a few tens of microseconds for the largest
captured agent body); the exact integer check only runs when that walk finds a float that could
have been such a literal, which a real agent body practically never holds.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

from openenv_harness.recorder.errors import AgentError, body_too_large

#: The largest value ``max_json_depth`` may take: a record holds the body two levels down and is
#: serialized by orjson, whose limit is 255 levels.
MAX_JSON_DEPTH_LIMIT = 200
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1
#: Floats at least this far from zero may have been integer literals outside the 64-bit range.
_SUSPECT = float(2**63)


def check_body(body: Any, raw: bytes, max_depth: int) -> None:
    """Raise a 400 ``AgentError`` if ``body`` (parsed from ``raw``) nests deeper than ``max_depth``
    levels (the top-level object is level 1) or held an integer orjson could not keep exact."""
    level: list[Any] = [body]
    depth = 1
    suspect = False
    while level:
        if depth > max_depth:
            raise AgentError(400, f"request body is nested more than {max_depth} levels deep",
                             code="too_deeply_nested")
        below: list[Any] = []
        add = below.append
        for node in level:
            for value in (node.values() if type(node) is dict else node):
                kind = type(value)
                if kind is dict or kind is list:
                    add(value)
                elif kind is float and not -_SUSPECT < value < _SUSPECT:
                    suspect = True
        level = below
        depth += 1
    if suspect:
        _check_integers(raw)


class _OutOfRange(Exception):
    def __init__(self, literal: str) -> None:
        self.literal = literal


def _exact_int(literal: str) -> int:
    value = int(literal)
    if not _INT_MIN <= value <= _INT_MAX:
        raise _OutOfRange(literal)
    return value


def not_json(exc: ValueError, raw: bytes) -> AgentError:
    """The 400 for a body orjson could not parse. A number beyond a double's range (more than about
    309 digits, or ``1e400``) is valid JSON that orjson refuses as such: it is named for what it is."""
    if "number is infinity" in str(exc):
        try:
            _check_integers(raw)
        except AgentError as refusal:
            return refusal
        except (ValueError, RecursionError):
            pass
        return AgentError(400, "request body holds a number beyond the 64-bit float range; the recorder forwards "
                          "bodies exactly and cannot represent it", code="number_out_of_range")
    return AgentError(400, f"request body is not valid JSON: {exc}", code="invalid_json")


def _check_integers(raw: bytes) -> None:
    """The exact check: the standard library's parser keeps integer literals as written."""
    try:
        json.loads(raw, parse_int=_exact_int)
    except _OutOfRange as exc:
        shown = exc.literal if len(exc.literal) <= 40 else exc.literal[:20] + "..." + exc.literal[-8:]
        raise AgentError(
            400, f"request body holds an integer outside the 64-bit range ({shown}); the recorder forwards "
            "bodies exactly and cannot represent it -- send it as a string", code="integer_out_of_range",
        ) from None


class ClientGone(Exception):
    """The client disconnected before its body was whole."""


async def receive_body(receive: Receive, content_length: str | None, limit: int) -> bytes:
    """A request's body from its ASGI ``receive``: refused as too large (413) from its declared length
    or as soon as more than ``limit`` bytes arrived -- never read whole first. The one reader of an
    agent body on the ASGI path (the agent fast path reads its own: ``edge/agent_protocol.py``)."""
    if content_length is not None and content_length.isdigit() and int(content_length) > limit:
        raise body_too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def read_body(request: Request, limit: int) -> bytes:
    """``receive_body`` for a route that has a Starlette request (the count-tokens routes)."""
    try:
        return await receive_body(request.receive, request.headers.get("content-length"), limit)
    except ClientGone:
        raise ClientDisconnect from None
