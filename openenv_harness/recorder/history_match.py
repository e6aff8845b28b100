"""Is an agent's replayed history the conversation the engine already sampled? With named equivalences.

Why a module: the incremental prompt mode may continue the exact checkpoint (previous prompt ids plus
the sampled ids) only if every message up to and including the previous assistant turn is what the
model saw or said. Agents re-serialize what they replay; three rewrites are accepted because they
change no meaning and a trainer wants the sampled tokens, not the agent's re-spelling:

- ``tool_arguments_reserialized``: tool-call arguments that parse to the same JSON value
  (``JSON.stringify(JSON.parse(s))`` drops the model's spaces);
- ``reasoning_field_renamed``: reasoning under ``reasoning_content`` instead of ``reasoning`` (or back);
- ``content_reflattened``: content as a list of text parts instead of one string (or back), and an
  empty string for a null content.

Tool-call ``id`` and ``type`` are ignored too (``tool_call_id_ignored`` is not named: the ids come
from the recorder's own reply). Anything else -- an edited, dropped or inserted message, reasoning
dropped, different tools -- is a history change, and the call starts a new chain.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson

EQUIVALENCES = ("tool_arguments_reserialized", "reasoning_field_renamed", "content_reflattened")
_KNOWN = {"role", "content", "reasoning", "reasoning_content", "tool_calls"}


def _text(content: Any, used: set[str]) -> Any:
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        used.add("content_reflattened")
        return "\n".join(str(p.get("text", "")) for p in content)
    return content


def _arguments(arguments: Any, used: set[str]) -> Any:
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError:
            return ["raw", arguments]
        used.add("tool_arguments_reserialized")
        return ["json", value]
    return ["json", arguments]


def canonical(message: Any, used: set[str] | None = None) -> Any:
    """The message in a form where the named equivalences compare equal; ``used`` collects their names."""
    used = used if used is not None else set()
    if not isinstance(message, dict):
        return ["opaque", message]
    out: dict[str, Any] = {k: v for k, v in message.items() if k not in _KNOWN and v is not None}
    out["role"] = message.get("role")
    out["content"] = _text(message.get("content"), used)
    reasoning = message.get("reasoning") or None
    if reasoning is None and message.get("reasoning_content"):
        reasoning = message["reasoning_content"]
        used.add("reasoning_field_renamed")
    if reasoning:
        out["reasoning"] = reasoning
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            [(c.get("function") or {}).get("name"), _arguments((c.get("function") or {}).get("arguments"), used)]
            if isinstance(c, dict) else ["opaque", c]
            for c in calls
        ]
    return out


def digest(message: Any) -> str:
    """A short digest of the canonical form (what a checkpoint keeps of each message)."""
    return hashlib.blake2b(orjson.dumps(canonical(message), option=orjson.OPT_SORT_KEYS), digest_size=12).hexdigest()


def digests(messages: list[Any]) -> list[str]:
    return [digest(m) for m in messages]


def used_equivalences(replayed: dict[str, Any], reply: dict[str, Any]) -> list[str]:
    """Which named equivalences made the replayed assistant turn equal to the reply the agent got."""
    used: list[str] = []
    sent = [(c.get("function") or {}).get("arguments") for c in reply.get("tool_calls") or [] if isinstance(c, dict)]
    back = [(c.get("function") or {}).get("arguments") for c in replayed.get("tool_calls") or [] if isinstance(c, dict)]
    if sent != back:
        used.append("tool_arguments_reserialized")
    if bool(reply.get("reasoning")) != bool(replayed.get("reasoning")):
        used.append("reasoning_field_renamed")
    if type(reply.get("content")) is not type(replayed.get("content")):
        used.append("content_reflattened")
    return used


def tools_digest(body: dict[str, Any]) -> str:
    """What else shapes the rendering: tools and template arguments must be unchanged too."""
    rendering = {"tools": body.get("tools"), "chat_template_kwargs": body.get("chat_template_kwargs")}
    return hashlib.blake2b(orjson.dumps(rendering, option=orjson.OPT_SORT_KEYS), digest_size=12).hexdigest()
