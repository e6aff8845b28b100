"""The argument text the model really sampled for each tool call, found in its sampled tokens.

Why: an engine's tool parser hands back ``arguments`` re-serialized (vLLM's Hermes parser, like the
reference engine's, runs ``json.dumps`` over what the model wrote), so ``{"cmd":"ls"}`` sampled
comes back as ``{"cmd": "ls"}``. A chat agent re-serializes that once more; Codex echoes whatever it
was given verbatim, and Claude Code keeps only the parsed object. Either way the next prompt renders
text the model never sampled, and the chain drifts for no reason of the agent's own.

The sampled text itself is in the engine's reply: the logprob entries carry each sampled token's
bytes (``bytes``, else its text). For every tool call, in order, the first JSON object literal in
that text that parses to exactly the call's arguments is the sampled argument text. The dialects
hand that text to the agent (Responses ``arguments``, Anthropic ``input_json_delta``) and remember
it (``ReplayMemory``) -- it is JSON-equal to what the parser returned, so the agent sees the same
arguments. When the text cannot be recovered (``token_id:N`` strings, a format that writes
arguments as anything but a JSON object) the parser's string is used. The record keeps
the engine's reply untouched either way, and the texts found in ``metadata.sampled_arguments``
(the record step, for a dialect that ``records_sampled_arguments``): the logprob entries they come from are not in the record.
"""

from __future__ import annotations

import json
from typing import Any

#: Completions longer than this are not searched (the parser's string is used).
MAX_SEARCH_CHARS = 1 << 20

_DECODER = json.JSONDecoder()


def sampled_text(engine_reply: dict[str, Any] | None) -> str | None:
    """The sampled completion as text, from the reply's logprob entries; None when not recoverable."""
    if not isinstance(engine_reply, dict):
        return None
    choices = engine_reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    logprobs = choices[0].get("logprobs")
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(entries, list) or not entries:
        return None
    raw = bytearray()
    for entry in entries:
        if not isinstance(entry, dict):
            return None
        data = entry.get("bytes")
        if isinstance(data, list):
            try:
                raw.extend(data)
            except (TypeError, ValueError):
                return None
            continue
        token = entry.get("token")
        if not isinstance(token, str) or token.startswith("token_id:"):
            return None
        raw.extend(token.encode("utf-8"))
    return raw.decode("utf-8", errors="replace")


def _objects(text: str, start: int) -> Any:
    """``(position, end, value)`` of each JSON object literal in ``text`` from ``start``, nested ones too."""
    position = text.find("{", start)
    while position >= 0:
        try:
            value, end = _DECODER.raw_decode(text, position)
        except ValueError:
            value, end = None, -1
        if isinstance(value, dict):
            yield position, end, value
        position = text.find("{", position + 1)


def raw_arguments(text: str | None, tool_calls: list[Any]) -> list[str | None]:
    """The sampled argument text of each tool call (None where it was not found), in call order."""
    out: list[str | None] = [None] * len(tool_calls)
    if not text or len(text) > MAX_SEARCH_CHARS:
        return out
    cursor = 0
    for i, call in enumerate(tool_calls):
        fn = call.get("function") if isinstance(call, dict) else None
        arguments = fn.get("arguments") if isinstance(fn, dict) else None
        try:
            wanted = json.loads(arguments) if isinstance(arguments, str) and arguments.strip() else None
        except ValueError:
            wanted = None
        if not isinstance(wanted, dict):
            continue
        for position, end, value in _objects(text, cursor):
            if value == wanted:
                out[i], cursor = text[position:end], end
                break
    return out


def sampled_arguments(engine_reply: dict[str, Any] | None, delivered: dict[str, Any]) -> list[str | None] | None:
    """Per tool call the agent is handed (``delivered``: the chat reply after the tool-call caps), the
    argument text the model sampled; None when the reply makes no tool calls."""
    choices = delivered.get("choices") or [{}]
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    tool_calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not tool_calls:
        return None
    return raw_arguments(sampled_text(engine_reply), tool_calls)
