"""Engine-side parsing of sampled text into reasoning, content and tool calls.

Why the engine parses: vLLM, started with a reasoning parser and a tool parser, never hands the
client the raw ``<think>`` / ``<tool_call>`` markup; it returns ``message.reasoning``,
``message.content`` and ``message.tool_calls`` with ``arguments`` re-serialized by ``json.dumps``.
The reference engine does the same, so whatever consumes it (the recorder, an agent) meets the
same transformation -- and the same replay drift -- as with a real server. Two tool-call formats:

- ``hermes`` (Qwen2.5, Qwen3): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``;
- ``qwen3_xml`` (the Qwen3.5 templates): ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n
  </parameter>\\n</function>\\n</tool_call>``, whose values come back as strings.

Reasoning is ``<think>...</think>`` at the start of the output -- or, when the prompt already
opened the think block (templates whose generation prompt ends with ``<think>\\n``), everything
up to ``</think>``.

The parser is the inverse of the reference template: it strips exactly the glue the template adds
(the newlines inside ``<think>``, the blank line after ``</think>`` and the newlines before the
first ``<tool_call>``), so that an agent echoing the parsed message back reproduces the sampled
text byte for byte. It also returns character spans, which the streaming encoder uses to decide
which token produced which delta.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Literal

from openenv_harness.testing.engine.tokenizer import THINK_CLOSE, THINK_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN

ToolParser = Literal["hermes", "qwen3_xml"]

_TOOL_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)
_ARGUMENTS_KEY = re.compile(r'"arguments"\s*:\s*')
_NAME_KEY = re.compile(r'"name"\s*:\s*"([^"]+)"')
_XML_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>")
_XML_PARAMETER = re.compile(r"<parameter=([^>]*)>(.*?)</parameter>", re.DOTALL)
_XML_FUNCTION_END = "</function>"

Span = tuple[int, int]


@dataclass(frozen=True)
class ParsedToolCall:
    """One ``<tool_call>`` block.

    ``span`` covers the block from its opening to its closing tag; ``name_end`` is where the name is
    complete (a streaming parser can announce the call from there); ``arguments_span`` is where the
    raw arguments sit inside the block (the whole block when they cannot be located).
    """

    name: str
    arguments: str
    span: Span
    arguments_span: Span
    name_end: int


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


def _parse_reasoning(text: str, open_think: bool) -> tuple[Span | None, int]:
    """The reasoning span and where the rest of the output starts."""
    if text.startswith(THINK_OPEN):
        begin = len(THINK_OPEN)
    elif open_think:
        begin = 0
    else:
        return None, 0
    close = text.find(THINK_CLOSE)
    if close < 0:  # still thinking (truncated or aborted): everything so far is reasoning
        return _strip_one(text, begin, len(text)), len(text)
    span = _strip_one(text, begin, close)
    rest = close + len(THINK_CLOSE)
    for _ in range(2):
        if rest < len(text) and text[rest] == "\n":
            rest += 1
    return span, rest


def _hermes_arguments_span(text: str, match: re.Match[str]) -> Span:
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


def _hermes_call(text: str, match: re.Match[str]) -> ParsedToolCall | None:
    try:
        payload = json.loads(match.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str) or "arguments" not in payload:
        return None
    arguments = json.dumps(payload["arguments"], ensure_ascii=False)
    name = _NAME_KEY.search(text, match.start(1), match.end(1))
    name_end = name.end() if name else match.end()
    return ParsedToolCall(payload["name"], arguments, match.span(), _hermes_arguments_span(text, match), name_end)


def _trim_newlines(value: str) -> str:
    """One leading and one trailing newline: the template's markup around a parameter value."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _xml_call(text: str, match: re.Match[str]) -> ParsedToolCall | None:
    inner_start, inner_end = match.span(1)
    function = _XML_FUNCTION.match(text, inner_start, inner_end)
    close = text.rfind(_XML_FUNCTION_END, inner_start, inner_end)
    if function is None or close < function.end():
        return None
    body = text[function.end() : close]
    params = {name.strip(): _trim_newlines(value) for name, value in _XML_PARAMETER.findall(body)}
    arguments = json.dumps(params, ensure_ascii=False)
    return ParsedToolCall(function.group(1).strip(), arguments, match.span(), (function.end(), close), function.end())


def _parse_tool_calls(text: str, start: int, tool_parser: ToolParser) -> list[ParsedToolCall] | None:
    """All tool-call blocks after ``start``; ``None`` when any block is unclosed or malformed."""
    read = _hermes_call if tool_parser == "hermes" else _xml_call
    calls: list[ParsedToolCall] = []
    for match in _TOOL_BLOCK.finditer(text, start):
        call = read(text, match)
        if call is None:
            return None
        calls.append(call)
    if text.count(TOOL_CALL_OPEN, start) != len(calls):
        return None
    return calls


def parse_output(text: str, parse_tools: bool, *, tool_parser: ToolParser = "hermes", reasoning: bool = True,
                 open_think: bool = False) -> ParsedOutput:
    """Split decoded completion text (special tokens already removed) like vLLM's parsers do.

    ``reasoning`` is whether a reasoning parser runs at all; ``open_think`` whether the prompt left
    a think block open.
    """
    reasoning_span, rest = _parse_reasoning(text, open_think) if reasoning else (None, 0)
    thought = text[reasoning_span[0] : reasoning_span[1]] if reasoning_span else None
    if not thought:
        thought, reasoning_span = None, None
    calls: list[ParsedToolCall] | None = None
    if parse_tools and TOOL_CALL_OPEN in text[rest:]:
        calls = _parse_tool_calls(text, rest, tool_parser)
    if calls:
        content_end = calls[0].span[0]
        glue = 1 if tool_parser == "hermes" else 2
        while glue and content_end > rest and text[content_end - 1] == "\n":
            content_end, glue = content_end - 1, glue - 1
    else:
        calls, content_end = [], len(text)
    content_span: Span | None = (rest, content_end) if content_end > rest else None
    content = text[rest:content_end] if content_span else None
    if content is None and not calls and reasoning_span is None and rest == 0:
        content = ""  # like vLLM: an empty plain completion has content "", not null
    return ParsedOutput(thought, content, calls, reasoning_span, content_span)
