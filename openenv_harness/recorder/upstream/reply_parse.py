"""Parse an engine's chat reply without turning its prompt ids into thousands of Python ints.

Why: a vLLM reply carries the whole canonical prompt as ``"prompt_token_ids":[...]`` -- 8k to 20k
ids per call, more bytes than the rest of the reply. A JSON parser builds one Python int per id,
only for the recorder to pack them straight back into a uint32 array; that was the largest single
cost of a call in the profiles (``docs/benchmarks.md``). Here that one span is cut out of the raw
bytes and read by numpy's C number parser into the array directly; orjson parses the small rest.

The fast path is taken only when it is certainly right, and the full parse decides otherwise:
- the key occurs exactly once, outside any string (inside a JSON string its quotes would be
  escaped, so ``"prompt_token_ids":[`` cannot match there);
- the span holds only digits, commas and spaces, and numpy reads exactly one number per comma-
  separated field, each below 2**32;
- after the span is replaced by ``null``, the top-level object has ``prompt_token_ids: null`` --
  so the span was the top-level field, not one nested deeper.
Anything else (negative ids, floats, an id too large, a malformed list) goes through the full
parse, so ``validate.py`` sees the original values and rejects them with its usual reasons.
"""

from __future__ import annotations

import json
import warnings
from array import array
from typing import Any

import numpy as np
import orjson

_KEY = b'"prompt_token_ids":['
_ALLOWED = b"0123456789, "
_UINT32_END = 1 << 32


def parse_json_object(raw: bytes) -> dict[str, Any] | None:
    """The body as a JSON object, or None. NaN/Infinity (Python-json engines) are kept for validation."""
    if not raw:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            value = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return None
    return value if isinstance(value, dict) else None


def parse_engine_reply(raw: bytes, *, status: int, chat: bool) -> tuple[dict[str, Any] | None, array | None]:
    """What every engine transport does with a reply body: the fast path for a chat success only."""
    if chat and status == 200:
        return parse_chat_reply(raw)
    return parse_json_object(raw), None


def parse_chat_reply(raw: bytes) -> tuple[dict[str, Any] | None, array | None]:
    """``(reply, prompt_ids)``. When ``prompt_ids`` is not None, ``reply["prompt_token_ids"]`` is None
    and the array holds the ids; otherwise ``reply`` is exactly the full parse."""
    start = raw.find(_KEY)
    if start < 0 or raw.find(_KEY, start + 1) >= 0:
        return parse_json_object(raw), None
    first = start + len(_KEY)
    end = raw.find(b"]", first)
    if end < 0:
        return parse_json_object(raw), None
    ids = _ids(raw[first:end])
    if ids is None:
        return parse_json_object(raw), None
    rest = parse_json_object(raw[:start] + b'"prompt_token_ids":null' + raw[end + 1 :])
    if rest is None or "prompt_token_ids" not in rest or rest["prompt_token_ids"] is not None:
        return parse_json_object(raw), None
    return rest, ids


def _ids(span: bytes) -> array | None:
    out = array("I")
    if not span.strip():
        return out
    if span.translate(None, _ALLOWED):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy warns, and stops early, on a malformed field
        try:
            values = np.fromstring(span, dtype=np.int64, sep=",")
        except (ValueError, DeprecationWarning):
            return None
    if len(values) != span.count(b",") + 1 or (len(values) and int(values.max()) >= _UINT32_END):
        return None  # an empty field, or an id beyond uint32 (numpy saturates on overflow)
    out.frombytes(values.astype(np.uintc).tobytes())  # np.uintc is C unsigned int, array("I")
    return out
