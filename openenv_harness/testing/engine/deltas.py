"""Which delta each streamed token carries: vLLM's incremental parsers, replayed on a known text.

Why a module of its own: a real vLLM decides a stream's deltas by re-parsing the text decoded so
far after every token. The reference engine knows the whole sampled text in advance, so it parses
it once (``parser``) and then asks, token by token, what the real parser would have released by
then:

- reasoning and content: the characters the token's bytes decode to (a token holding part of a
  multi-byte character releases nothing; tokens that show no text -- markup, the end-of-turn id --
  get an empty delta);
- a tool call (hermes): its head ``{id, type, index, function: {name}}`` -- never with an
  ``arguments`` key -- once the name is complete, then the *raw sampled* argument text piece by
  piece (so the pieces concatenate to what the model wrote, while the non-streamed reply carries
  the ``json.dumps`` re-serialization); every tool-call delta says ``content: null``;
- a tool call (Qwen3.5 XML): the head once ``<function=NAME>`` is complete, then the JSON
  arguments in pieces spread over the parameter text.
"""

from __future__ import annotations

import codecs
from typing import Any

from openenv_harness.testing.engine.parser import ParsedOutput, Span, ToolParser
from openenv_harness.testing.engine.tokenizer import ReferenceTokenizer


def _overlap(span: tuple[int, int], start: int, end: int) -> tuple[int, int] | None:
    low, high = max(span[0], start), min(span[1], end)
    return (low, high) if low < high else None


def _released_raw(text: str, span: Span, end: int) -> int:
    """How much of the raw argument text at ``span`` a hermes parser has released when the
    decoded text ends at ``end``: all of it up to there, less trailing whitespace it holds back."""
    begin, finish = span
    upto = min(max(end, begin), finish)
    while upto > begin and text[upto - 1].isspace() and upto < finish:
        upto -= 1
    return upto - begin


def _released_json(call_arguments: str, span: Span, end: int, block_end: int) -> int:
    begin, finish = span
    if end >= block_end:
        return len(call_arguments)
    progress = min(max(end, begin), finish) - begin
    return len(call_arguments) * progress // max(finish - begin, 1)


def token_deltas(tokenizer: ReferenceTokenizer, token_ids: list[int], text: str, parsed: ParsedOutput,
                 tool_call_ids: list[str], reasoning_field: str, tool_parser: ToolParser) -> list[dict[str, Any]]:
    """One delta per sampled token (``{}`` where the token releases nothing)."""
    special = tokenizer.special_ids
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    last = len(token_ids) - 1
    sent = [0] * len(parsed.tool_calls)
    announced = [False] * len(parsed.tool_calls)
    deltas: list[dict[str, Any]] = []
    start = 0
    for position, token_id in enumerate(token_ids):
        data = b"" if token_id in special else tokenizer.token_bytes[token_id]
        end = start + len(decoder.decode(data, final=position == last))
        delta: dict[str, Any] = {}
        if parsed.reasoning_span and (piece := _overlap(parsed.reasoning_span, start, end)):
            delta[reasoning_field] = text[piece[0] : piece[1]]
        if parsed.content_span and (piece := _overlap(parsed.content_span, start, end)):
            delta["content"] = text[piece[0] : piece[1]]
        calls: list[dict[str, Any]] = []
        for index, call in enumerate(parsed.tool_calls):
            if end < call.name_end or start >= call.span[1]:
                continue
            if not announced[index]:
                announced[index] = True
                calls.append({"id": tool_call_ids[index], "type": "function", "index": index,
                              "function": {"name": call.name}})
            if tool_parser == "hermes":
                raw = text[call.arguments_span[0] : call.arguments_span[1]]
                upto = _released_raw(text, call.arguments_span, end)
                pieces = raw
            else:
                upto = _released_json(call.arguments, call.arguments_span, end, call.span[1])
                pieces = call.arguments
            if upto > sent[index]:
                calls.append({"index": index, "function": {"arguments": pieces[sent[index] : upto]}})
                sent[index] = upto
        if calls:
            delta.setdefault("content", None)
            delta["tool_calls"] = calls
        deltas.append(delta)
        start = end
    return deltas
