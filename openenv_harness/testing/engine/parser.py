"""Engine-side parsing of sampled text into reasoning, content and tool calls.

Why the engine parses: vLLM, started with a reasoning parser and the Hermes tool parser, never
hands the client the raw ``<think>`` / ``<tool_call>`` markup; it returns ``message.reasoning``,
``message.content`` and ``message.tool_calls`` with ``arguments`` re-serialized by ``json.dumps``.
The reference engine does the same, so whatever consumes it (the recorder, an agent) meets the
same transformation -- and the same replay drift -- as with a real server.

The parser is the inverse of the reference template: it strips exactly the glue the template adds
(the newlines inside ``<think>``, the blank line after ``</think>`` and the newline before the
first ``<tool_call>``), so that an agent echoing the parsed message back reproduces the sampled
text byte for byte. It also returns character spans, which the streaming encoder uses to decide
which token produced which delta.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from openenv_harness.testing.engine.tokenizer import THINK_CLOSE, THINK_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN

_TOOL_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)
_ARGUMENTS_KEY = re.compile(r'"arguments"\s*:\s*')

Span = tuple[int, int]


@dataclass(frozen=True)
class ParsedToolCall:
    """One ``<tool_call>`` block.

    ``span`` covers the block from its opening to its closing tag; ``arguments_span`` is where the
    raw arguments value sits inside it (the whole block when it cannot be located).
    """

    name: str
    arguments: str
    span: Span
    arguments_span: Span


@dataclass(frozen=True)
class ParsedOutput:
    """What the client sees of a completion, plus where each part sits in the sampled text."""

    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[ParsedToolCall] = field(default_factory=list)
    reasoning_span: Span | None = None
    content_span: Span | None = None


def _strip_one(text: str, start: int, end: int, char: str = "\n") -> Span:
    """Shrink ``[start, end)`` by one leading and one trailing ``char`` where present."""
    if start < end and text[start] == char:
        start += 1
    if start < end and text[end - 1] == char:
        end -= 1
    return start, end


def _parse_reasoning(text: str) -> tuple[Span | None, int]:
    """The reasoning span and where the rest of the output starts."""
    if not text.startswith(THINK_OPEN):
        return None, 0
    close = text.find(THINK_CLOSE)
    if close < 0:  # still thinking (truncated or aborted): everything so far is reasoning
        return _strip_one(text, len(THINK_OPEN), len(text)), len(text)
    span = _strip_one(text, len(THINK_OPEN), close)
    rest = close + len(THINK_CLOSE)
    for _ in range(2):
        if rest < len(text) and text[rest] == "\n":
            rest += 1
    return span, rest


def _arguments_span(text: str, match: re.Match[str]) -> Span:
    """The raw ``arguments`` value of a block written as ``{"name": ..., "arguments": VALUE}``."""
    inner_start, inner_end = match.span(1)
    keys = list(_ARGUMENTS_KEY.finditer(text, inner_start, inner_end))
    key = keys[-1] if keys else None
    closing = text.rfind("}", inner_start, inner_end)
    if key is None or closing <= key.end():
        return match.span()
    end = closing
    while end > key.end() and text[end - 1].isspace():
        end -= 1
    return key.end(), end


def _parse_tool_calls(text: str, start: int) -> list[ParsedToolCall] | None:
    """All tool-call blocks after ``start``; ``None`` when any block is unclosed or not valid JSON."""
    calls: list[ParsedToolCall] = []
    for match in _TOOL_BLOCK.finditer(text, start):
        try:
            payload = json.loads(match.group(1))
        except json.JSONDecodeError:
            return None
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or "arguments" not in payload:
            return None
        arguments = json.dumps(payload["arguments"], ensure_ascii=False)
        calls.append(ParsedToolCall(payload["name"], arguments, match.span(), _arguments_span(text, match)))
    opened = text.count(TOOL_CALL_OPEN, start)
    if opened != len(calls):
        return None
    return calls


def parse_output(text: str, parse_tools: bool) -> ParsedOutput:
    """Split decoded completion text (special tokens already removed) like vLLM's parsers do."""
    reasoning_span, rest = _parse_reasoning(text)
    reasoning = text[reasoning_span[0] : reasoning_span[1]] if reasoning_span else None
    if not reasoning:
        reasoning, reasoning_span = None, None
    calls: list[ParsedToolCall] | None = None
    if parse_tools and TOOL_CALL_OPEN in text[rest:]:
        calls = _parse_tool_calls(text, rest)
    if calls:
        content_end = calls[0].span[0]
        if content_end > rest and text[content_end - 1] == "\n":
            content_end -= 1
    else:
        calls, content_end = [], len(text)
    content_span: Span | None = (rest, content_end) if content_end > rest else None
    content = text[rest:content_end] if content_span else None
    if content is None and not calls and not text.startswith(THINK_OPEN):
        content = ""  # like vLLM: an empty plain completion has content "", not null
    return ParsedOutput(reasoning, content, calls, reasoning_span, content_span)
