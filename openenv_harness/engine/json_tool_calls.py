"""Tool calls written as JSON in plain text: the form small instruct models sample unconstrained.

Qwen2.5-Coder-0.5B, asked to use a tool, mostly answers with the call as a fenced JSON block
(```json {"name": ..., "arguments": {...}} ```) instead of its template's ``<tool_call>`` tags. A
parser that only reads the tags turns those answers into text, the agent never acts, and the only
way left to make it act is constrained decoding, whose samples are not the policy's. Reading the
JSON the model wrote keeps every sampled id the model's own; the chat template renders the call in
its canonical form on the next turn, and the recorder's incremental prompt mode keeps the sampled
ids in the next prompt instead (``recorder/prompt_modes``).

This module is pure (no vLLM import) so the engine's parser plugin (``vllm_tool_parser.py``) and
the tests share one reading. Only calls to a tool the request declared are accepted: a JSON example
in an answer about JSON stays text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: a fenced block: ``` or ```json (any info string), its body, the closing fence (or the end of the
#: answer: the model often stops before closing it)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:\n?[ \t]*```|\Z)", re.DOTALL)
#: closing braces a call may lack: the model often stops one or two short of the object's end
_MAX_MISSING_BRACES = 2


@dataclass(frozen=True)
class JSONToolCall:
    name: str
    #: the arguments as a JSON object's text (what OpenAI's wire format carries)
    arguments: str


@dataclass(frozen=True)
class ParsedOutput:
    #: text outside the calls (before the first), or None when there is none
    content: str | None
    calls: list[JSONToolCall]


def _as_call(value: Any, tools: frozenset[str] | None) -> JSONToolCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    name = value["name"]
    if tools is not None and name not in tools:
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):  # the arguments as a JSON string (OpenAI's own wire form), decoded once
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return JSONToolCall(name=name, arguments=json.dumps(args, ensure_ascii=False))


def _loads(text: str) -> Any:
    """The JSON value of ``text``, or of ``text`` with the closing braces it lacks; ValueError otherwise."""
    for missing in range(_MAX_MISSING_BRACES + 1):
        try:
            return json.loads(text + "}" * missing)
        except ValueError:
            if not text.lstrip().startswith("{"):
                raise
    raise ValueError("not JSON")


def _calls_in(text: str, tools: frozenset[str] | None) -> list[JSONToolCall] | None:
    """The calls one JSON text holds (an object or a list of objects), or None when it holds other JSON."""
    try:
        value = _loads(text)
    except ValueError:
        return None
    values = value if isinstance(value, list) else [value]
    calls = [_as_call(v, tools) for v in values]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _strip_markers(text: str, markers: Iterable[str]) -> str:
    """``text`` without the special tokens' text at its end (an engine that keeps special tokens in the
    text, as vLLM does for tool parsing, leaves the end-of-turn marker after the call)."""
    text = text.strip()
    changed = True
    while changed:
        changed = False
        for marker in markers:
            if marker and text.endswith(marker):
                text, changed = text[: -len(marker)].rstrip(), True
    return text


def parse_json_tool_calls(output: str, tool_names: Iterable[str] | None,
                          special_tokens: Iterable[str] = ()) -> ParsedOutput:
    """Read tool calls from fenced JSON blocks, or from an answer that is one JSON call and nothing
    else. ``tool_names``: the request's tools (None accepts any name); ``special_tokens``: marker
    texts ignored at the end of the answer."""
    tools = frozenset(tool_names) if tool_names is not None else None
    calls: list[JSONToolCall] = []
    first_start: int | None = None
    for match in _FENCE.finditer(output):
        if match.group(1).lower() not in ("", "json", "tool_call", "tool"):
            continue
        found = _calls_in(_strip_markers(match.group(2), tuple(special_tokens)), tools)
        if found:
            calls.extend(found)
            first_start = match.start() if first_start is None else first_start
    if not calls:
        found = _calls_in(_strip_markers(output, tuple(special_tokens)), tools)
        if found:
            return ParsedOutput(content=None, calls=found)
        return ParsedOutput(content=output, calls=[])
    content = output[:first_start].strip() if first_start else ""
    return ParsedOutput(content=content or None, calls=calls)
