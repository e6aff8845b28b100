"""Parse an engine's chat reply without turning its prompt ids into thousands of Python ints.

Why: a vLLM reply carries the whole canonical prompt as ``"prompt_token_ids":[...]`` -- 8k to 20k
ids per call, more bytes than the rest of the reply. A JSON parser builds one Python int per id,
only for the recorder to pack them straight back into a uint32 array; that was the largest single
cost of a call in the profiles (``docs/benchmarks.md``). Here that one span is cut out of the raw
bytes and read by simdjson into a native integer buffer directly; orjson parses the small rest.

The fast path is taken only when it is certainly right, and the full parse decides otherwise:
- the name ``"prompt_token_ids"`` occurs exactly once in the body, followed by ``:[`` (inside a
  JSON string its quotes would be escaped, so it cannot match there): a duplicated key, or the
  key nested in another object as well (``kv_transfer_params``), is never guessed at;
- the span, read as a JSON array, is a flat list of integers, each in [0, 2**32) -- so it holds
  no quote, and the name and the marker below cannot hide inside it;
- after the span is replaced by a marker string that occurs nowhere else in the body, the
  top-level object's ``prompt_token_ids`` *is that marker* -- so the span was the top-level
  field's value (the last one, as every JSON parser reads duplicates), not one nested deeper
  under a top level whose own key is null, absent, or spelled with an escape (``prompt\u005f...``).
Anything else (negative ids, floats, an id too large, a malformed list) goes through the full
parse, so ``validate.py`` sees the original values and rejects them with its usual reasons.

A transport only cuts the span out (``split_chat_reply``); the flow reads it with the session's
``PromptIdsReader``, which reuses the ids of the session's previous prompt for the text the two
share: an agent's prompt repeats its whole history, so only the new turn's ids are parsed.
"""

from __future__ import annotations

import json
import threading
from array import array
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import orjson
import simdjson

if TYPE_CHECKING:
    from openenv_harness.recorder.upstream.base import UpstreamReply
    from openenv_harness.recorder.upstream.span_budget import SpanBudget

_NAME = b'"prompt_token_ids"'
_KEY = _NAME + b":["
#: What the span is replaced with before the rest is parsed; a body that holds it takes the full parse.
_MARK_VALUE = "oeh:prompt-token-ids-span"
_MARK = b'"' + _MARK_VALUE.encode() + b'"'
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


def parse_engine_reply(raw: bytes, *, status: int, chat: bool) -> tuple[dict[str, Any] | None, bytes | None, list[str]]:
    """What every engine transport does with a reply body: ``(reply, span, doubts)``; the span is
    cut out of a chat success only, and ``doubts`` says what makes its evidence untrustworthy
    although it parses (``duplicated_token_keys``)."""
    if chat and status == 200:
        reply, span, bounds = _split(raw)
        return reply, span, duplicated_token_keys(raw, bounds)
    return parse_json_object(raw), None, []


def split_chat_reply(raw: bytes) -> tuple[dict[str, Any] | None, bytes | None]:
    """``(reply, span)``. When ``span`` is not None it is the raw text between the brackets of the
    top-level ``prompt_token_ids`` and ``reply["prompt_token_ids"]`` is None; otherwise ``reply`` is
    exactly the full parse. The span is not checked here: ``read_ids`` (or the full parse, when it
    refuses) decides what it holds."""
    reply, span, _ = _split(raw)
    return reply, span


def _split(raw: bytes) -> tuple[dict[str, Any] | None, bytes | None, tuple[int, int] | None]:
    """``split_chat_reply``, and where the span lies (``(start of the key, end of the list)``)."""
    start = raw.find(_NAME)
    if start < 0 or not raw.startswith(_KEY, start):
        return parse_json_object(raw), None, None
    first = start + len(_KEY)
    end = raw.find(b"]", first)
    if end < 0:
        return parse_json_object(raw), None, None
    # Only the text outside the span is searched: a span the reader accepts holds nothing but digits,
    # commas and blanks, and one it refuses sends the reply through the full parse anyway.
    if raw.find(_NAME, end) >= 0 or raw.find(_MARK, 0, start) >= 0 or raw.find(_MARK, end) >= 0:
        return parse_json_object(raw), None, None
    rest = parse_json_object(raw[:start] + _NAME + b":" + _MARK + raw[end + 1 :])
    if rest is None or rest.get("prompt_token_ids") != _MARK_VALUE:
        return parse_json_object(raw), None, None
    rest["prompt_token_ids"] = None
    return rest, raw[first:end], (start, end)


_TOKEN_NAME = b'"token_ids"'  # not inside '"prompt_token_ids"': a quote never precedes its "token_ids"
_TOKEN_KEYS = ("prompt_token_ids", "token_ids")


def duplicated_token_keys(raw: bytes, span: tuple[int, int] | None = None) -> list[str]:
    """Why a reply's token ids cannot be trusted although it parses: a token key given twice in
    one object. JSON parsers keep the last value; which one the engine meant nobody knows, so the
    evidence is doubtful (recorded untrainable), never a guess.

    Cheap for a reply that can have none: each name is counted outside the prompt span (the fast
    reader proved the prompt key occurs once); only a reply naming a key more than once -- nested
    in another object, or really duplicated -- is parsed again to tell which.
    """
    if span is not None:
        start, end = span
        if raw.count(_TOKEN_NAME, 0, start) + raw.count(_TOKEN_NAME, end) <= 1:
            return []
    elif raw.count(_TOKEN_NAME) <= 1 and raw.count(_NAME) <= 1:
        return []
    repeated: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        names = [name for name, _ in items]
        for key in _TOKEN_KEYS:
            if names.count(key) > 1 and key not in repeated:
                repeated.append(key)
        return dict(items)

    try:
        json.loads(raw, object_pairs_hook=pairs)
    except (ValueError, UnicodeDecodeError):
        return []  # not JSON: the reply is refused as such
    return [f"the reply gives {key} more than once in one object" for key in repeated]


def parse_chat_reply(raw: bytes) -> tuple[dict[str, Any] | None, array[int] | None]:
    """``(reply, prompt_ids)``: ``split_chat_reply`` and ``read_ids`` in one, for a reply on its own.
    When the span is not a clean id list, ``reply`` is the full parse and ``prompt_ids`` None."""
    reply, span = split_chat_reply(raw)
    if span is None:
        return reply, None
    ids = read_ids(span)
    if ids is None:
        return parse_json_object(raw), None
    return reply, ids


def read_ids(span: bytes) -> array[int] | None:
    """The ids of a span of comma-separated JSON integers, or None unless every field is one id < 2**32.

    simdjson parses the span as a JSON array straight into a native uint64 buffer (no Python int
    per id; about 3x faster than numpy's text parser at 8k ids, which was the largest share of a
    call's own time at one session). Anything that is not a flat list of JSON integers -- floats,
    strings, empty fields, leading zeros, a nested list -- is refused, as is a negative or
    too-large id, so the full parse and ``validate.py`` get to name the bad values.
    """
    if b"[" in span:
        return None  # simdjson flattens nested arrays in a buffer; a prompt's ids never nest
    try:
        # a document that opens with "[" parses to an Array or raises
        document = cast(simdjson.Array, _thread.parser.parse(b"[" + span + b"]"))
        buffer = document.as_buffer(of_type="u")
    except (ValueError, TypeError, RuntimeError):  # not JSON, not integers, negative, beyond uint64
        return None
    values = np.frombuffer(buffer, dtype=np.uint64)
    out = array("I")
    if len(values) == 0:
        return out
    if int(values.max()) >= _UINT32_END:
        return None
    out.frombytes(values.astype(np.uintc).tobytes())  # np.uintc is C unsigned int, array("I")
    return out


class _ThreadParser(threading.local):
    """One simdjson parser per thread, made on the thread's first use: it reuses its buffers between
    documents (most of its speed) and is not safe to share between threads."""

    def __init__(self) -> None:
        self.parser = simdjson.Parser()


_thread = _ThreadParser()


class PromptIdsReader:
    """One session's prompt spans read into ids, reusing the ids of a recent prompt it extends.

    Why: each call of an agent's conversation sends the whole history again, so its prompt's text
    starts with the previous prompt's text followed by a comma. Those ids are already known and
    checked; only the rest is parsed -- about one turn's ids instead of the whole context. A span
    that extends no recent one is parsed whole. Held state is the last few spans and their ids:
    it follows the context length, not the number of calls; with a ``budget`` (the recorder's),
    the spans of the sessions that called least recently are dropped past its bound
    (``span_budget.py``) -- only speed depends on them, never the ids read.
    """

    __slots__ = ("__weakref__", "_budget", "_recent")

    #: prompts remembered: the main chain, plus room for an auxiliary call (a title, a sub-agent)
    KEEP = 3

    def __init__(self, budget: SpanBudget | None = None) -> None:
        self._recent: list[tuple[bytes, array[int]]] = []
        self._budget = budget

    def drop_spans(self) -> None:
        """Forget the remembered spans (the budget needs the room): the next span is parsed whole."""
        self._recent = []

    def held_bytes(self) -> int:
        return sum(len(span) + len(ids) * ids.itemsize for span, ids in self._recent)

    def release(self) -> None:
        """The session is closed: forget the spans and what they held against the budget."""
        self._recent = []
        if self._budget is not None:
            self._budget.release(self)

    def take(self, reply: UpstreamReply) -> array[int] | None:
        """The prompt ids of a reply whose transport cut out their span (None when it did not).
        A span that is not a clean id list sends the reply through the full parse instead:
        validation then names the bad values, and a body that is not JSON at all stays the
        engine's error like any other."""
        span, reply.prompt_span = reply.prompt_span, None
        if span is None:
            return None
        ids = self.read(span)
        if ids is None:
            reply.json = parse_json_object(reply.body)
        return ids

    def read(self, span: bytes) -> array[int] | None:
        """The span's ids, or None unless it is a clean list of uint32 ids (see ``read_ids``)."""
        base = self._base(span)
        if base is None:
            ids = read_ids(span)
        elif len(base[0]) == len(span):
            ids = base[1]  # the same prompt again (a retry that was not a twin): arrays are never mutated
        else:
            suffix = span[len(base[0]) + 1 :]
            tail = read_ids(suffix) if suffix.strip() else None  # a trailing comma is not JSON
            ids = base[1] + tail if tail is not None else None
        if ids is None:
            return None
        # the prompt it extends is superseded by this one; the others stay, most recent first
        self._recent = [(span, ids), *(r for r in self._recent if r is not base)][: self.KEEP]
        if self._budget is not None:
            self._budget.charge(self, self.held_bytes())
        return ids

    def _base(self, span: bytes) -> tuple[bytes, array[int]] | None:
        """The longest remembered span that ``span`` equals or extends by ``,<more ids>``."""
        best: tuple[bytes, array[int]] | None = None
        for entry in self._recent:
            known = entry[0]
            if best is not None and len(known) <= len(best[0]):
                continue
            if known == span or (len(span) > len(known) and span[len(known)] == 0x2C and span.startswith(known)):
                best = entry
        return best
