"""How coding-agent CLIs send an assistant reply back in their next request.

Why tests need this: whether the next prompt extends the previous one token for token depends on
what the agent echoes. Both Pi and OpenCode re-serialize tool arguments with
``JSON.stringify(JSON.parse(args))`` (whitespace gone, escapes decoded, key order kept); OpenCode
sends ``content: ""`` and always names reasoning ``reasoning_content``; Pi sends ``content: null``
and keeps the field name it received. ``exact`` echoes the message as received.
"""

from __future__ import annotations

import json
from typing import Any, Literal

EchoStyle = Literal["opencode", "pi", "exact"]


def _js_value(value: Any) -> Any:
    """Python values as JavaScript would print them (integral floats lose their ``.0``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _js_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_js_value(v) for v in value]
    return value


def js_restringify(arguments: str) -> str:
    """``JSON.stringify(JSON.parse(arguments))``."""
    return json.dumps(_js_value(json.loads(arguments)), separators=(",", ":"), ensure_ascii=False)


def agent_echo(message: dict[str, Any], style: EchoStyle = "opencode") -> dict[str, Any]:
    """The assistant ``message`` (as an engine returned it) as an agent puts it in its history."""
    if style == "exact":
        return {k: v for k, v in message.items() if v is not None or k == "content"}
    echoed: dict[str, Any] = {"role": "assistant"}
    content = message.get("content")
    echoed["content"] = (content or "") if style == "opencode" else (content or None)
    for field in ("reasoning", "reasoning_content"):
        if message.get(field):
            echoed["reasoning_content" if style == "opencode" else field] = message[field]
    calls = message.get("tool_calls") or []
    if calls:
        echoed["tool_calls"] = [
            {
                "id": call.get("id"),
                "type": "function",
                "function": {
                    "name": call["function"]["name"],
                    "arguments": js_restringify(call["function"]["arguments"] or "{}"),
                },
            }
            for call in calls
        ]
    return echoed
