"""An Anthropic Messages request (``POST /v1/messages``, Claude Code) as a chat completions request.

The conventions are those of vLLM's own ``/v1/messages`` route (``vllm/entrypoints/anthropic``),
so a prompt recorded here is the prompt vLLM's native route would have rendered: system blocks
joined without a separator, Claude Code's ``x-anthropic-billing-header`` system block dropped (it is
request metadata with a per-request hash, not prompt text), inline ``system`` messages kept where
they are, thinking as the assistant's ``reasoning``, ``tool_result`` blocks as ``tool`` messages
ahead of the rest of their user turn, ``output_config.effort`` as ``reasoning_effort``, and
``tool_addition``/``tool_removal`` blocks resolved into the one tool list a chat template sees.

One deliberate difference, for fidelity: a replayed ``tool_use`` gets back the argument text the
engine sampled (``ReplayMemory``) when its ``input`` object is exactly what we sent; only an input
the agent changed is serialized anew (``json.dumps``, as vLLM does). Likewise a thinking block
that comes back without its text is restored from its signature.

Anything this cannot translate faithfully -- an unknown content-block type, a block in the wrong
role, a server tool -- is a 400 in Anthropic's error shape: nothing reaches the engine or the store.
"""

from __future__ import annotations

import json
from typing import Any

from openenv_harness.recorder.dialects.base import invalid
from openenv_harness.recorder.dialects.dialect_call import DialectCall
from openenv_harness.recorder.dialects.memory import ReplayMemory

BILLING_HEADER = "x-anthropic-billing-header"

_ROLES = ("user", "assistant", "system")
_USER_BLOCKS = {"text", "image", "tool_result", "tool_reference"}
_ASSISTANT_BLOCKS = {"text", "thinking", "redacted_thinking", "tool_use", "tool_result"}
_SYSTEM_BLOCKS = {"text", "tool_addition", "tool_removal"}


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise invalid(f"{where} must be a string")
    return value


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        raise invalid(f"{where} must be a string or an array of content blocks")
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise invalid(f"{where}[{i}] must be a content block object with a string 'type'")
    return content


def system_text(content: Any, where: str) -> str:
    """The text of a system prompt (string or text blocks), without the billing header."""
    if isinstance(content, str):
        return "" if content.startswith(BILLING_HEADER) else content
    parts = []
    for i, block in enumerate(_blocks(content, where)):
        if block["type"] in ("tool_addition", "tool_removal"):
            continue
        if block["type"] != "text":
            raise invalid(f"{where}[{i}]: a system prompt holds text blocks, not {block['type']!r}")
        text = _text(block.get("text"), f"{where}[{i}].text")
        if text and not text.startswith(BILLING_HEADER):
            parts.append(text)
    return "".join(parts)


def image_url(block: dict[str, Any], where: str) -> str:
    source = block.get("source")
    if not isinstance(source, dict):
        raise invalid(f"{where}.source must be an object")
    if source.get("type") == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise invalid(f"{where}.source needs string 'media_type' and 'data'")
        return f"data:{media};base64,{data}"
    url = source.get("url")
    if source.get("type") == "url" and isinstance(url, str):
        return url
    raise invalid(f"{where}.source.type must be 'base64' or 'url'")


def _tool_result(block: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """A user turn's ``tool_result`` as chat messages: the tool message, then any images."""
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise invalid(f"{where}.tool_use_id must be a non-empty string")
    content = block.get("content")
    texts: list[str] = []
    images: list[str] = []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for j, item in enumerate(_blocks(content, f"{where}.content")):
            kind = item["type"]
            if kind == "text":
                texts.append(_text(item.get("text"), f"{where}.content[{j}].text"))
            elif kind == "image":
                images.append(image_url(item, f"{where}.content[{j}]"))
            elif kind != "tool_reference":
                raise invalid(f"{where}.content[{j}]: unsupported block type {kind!r} in a tool result")
    elif content is not None:
        raise invalid(f"{where}.content must be a string or an array of blocks")
    out: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": tool_use_id, "content": "\n".join(texts)}]
    if images:
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})
    return out


def _tool_use(block: dict[str, Any], where: str, memory: ReplayMemory) -> dict[str, Any]:
    call_id, name, tool_input = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise invalid(f"{where} needs a non-empty string 'id' and 'name'")
    if not isinstance(tool_input, dict):
        raise invalid(f"{where}.input must be a JSON object")
    arguments = memory.sampled_arguments(call_id, tool_input)
    if arguments is None:
        arguments = json.dumps(tool_input)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _thinking(block: dict[str, Any], where: str, memory: ReplayMemory) -> str:
    text = block.get("thinking")
    if text is not None and not isinstance(text, str):
        raise invalid(f"{where}.thinking must be a string")
    return text or memory.reasoning(block.get("signature")) or ""


def _message(msg: Any, where: str, memory: ReplayMemory, changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages (tool results become their own ``tool`` messages)."""
    if not isinstance(msg, dict):
        raise invalid(f"{where} must be an object")
    role = msg.get("role")
    if role not in _ROLES:
        raise invalid(f"{where}.role must be one of {', '.join(_ROLES)}")
    content = msg.get("content")
    if role == "system":
        if isinstance(content, list):
            changes.extend(b for b in _blocks(content, f"{where}.content") if b["type"] in ("tool_addition", "tool_removal"))
        text = system_text(content, f"{where}.content")
        return [{"role": "system", "content": text}] if text else []
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    allowed = _USER_BLOCKS if role == "user" else _ASSISTANT_BLOCKS
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for i, block in enumerate(_blocks(content, f"{where}.content")):
        kind, at = block["type"], f"{where}.content[{i}]"
        if kind not in allowed:
            raise invalid(f"{at}: content block type {kind!r} is not supported in a {role} message")
        if kind == "text":
            text = _text(block.get("text"), f"{at}.text")
            if text:
                parts.append({"type": "text", "text": text})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": image_url(block, at)}})
        elif kind == "tool_result" and role == "user":
            out.extend(_tool_result(block, at))
        elif kind == "tool_result":  # in an assistant turn, as vLLM renders it: plain text
            parts.append({"type": "text", "text": f"Tool result: {block.get('content') or ''}"})
        elif kind == "tool_use":
            calls.append(_tool_use(block, at, memory))
        elif kind == "thinking":
            reasoning.append(_thinking(block, at, memory))
        # redacted_thinking: opaque, never ours; tool_reference: resolved with the tool result
    if role == "user" and not parts:
        return out
    chat: dict[str, Any] = {"role": role}
    if len(parts) == 1 and parts[0]["type"] == "text":
        chat["content"] = parts[0]["text"]
    else:
        chat["content"] = parts if parts else ""
    if reasoning and any(reasoning):
        chat["reasoning"] = "".join(reasoning)
    if calls:
        chat["tool_calls"] = calls
    return [*out, chat]


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise invalid(f"{where} must be an object")
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise invalid(f"{where}: server tool type {kind!r} is not supported (only client tools with an input_schema)")
    name, schema = tool.get("name"), tool.get("input_schema")
    if not isinstance(name, str) or not name:
        raise invalid(f"{where}.name must be a non-empty string")
    if not isinstance(schema, dict):
        raise invalid(f"{where}.input_schema must be a JSON Schema object")
    if "type" not in schema:
        schema = {**schema, "type": "object"}
    function: dict[str, Any] = {"name": name, "description": tool.get("description"), "parameters": schema}
    for key in ("strict", "defer_loading"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _resolve_tools(tools: list[dict[str, Any]] | None, changes: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The tool list in effect at the end of the conversation (additions and removals applied)."""
    if not changes:
        return tools
    by_name = {t["function"]["name"]: t for t in tools or []}
    removed: set[str] = set()
    for i, block in enumerate(changes):
        change = block.get("tool")
        if not isinstance(change, dict):
            raise invalid(f"{block['type']} block {i} needs a 'tool' object")
        if change.get("type") == "tool_definition" and block["type"] == "tool_addition":
            tool = _tool(change.get("definition"), f"{block['type']}.tool.definition")
            name = tool["function"]["name"]
            by_name[name] = tool
        elif change.get("type") == "tool_reference" and isinstance(change.get("name"), str):
            name = change["name"]
            if name not in by_name:
                raise invalid(f"{block['type']} references tool {name!r}, which is not declared in tools")
            if block["type"] == "tool_addition":
                function = {k: v for k, v in by_name[name]["function"].items() if k != "defer_loading"}
                by_name[name] = {"type": "function", "function": function}
        else:
            raise invalid(f"{block['type']}.tool must be a tool_reference (or, to add, a tool_definition)")
        if block["type"] == "tool_removal":
            removed.add(name)
        else:
            removed.discard(name)
    return [tool for name, tool in by_name.items() if name not in removed]


def _tool_choice(choice: Any) -> tuple[Any, bool | None]:
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise invalid("tool_choice.type must be one of auto, any, tool, none")
    parallel = None if choice.get("disable_parallel_tool_use") is None else not choice["disable_parallel_tool_use"]
    kind = choice["type"]
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise invalid("tool_choice of type 'tool' needs a 'name'")
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[kind], parallel


def to_chat(body: dict[str, Any], memory: ReplayMemory, *, count_only: bool = False) -> tuple[dict[str, Any], DialectCall]:
    """The chat request for a Messages request (``count_only``: a count_tokens body, no sampling fields).

    Dropped because a chat engine has no counterpart: ``metadata``, ``context_management``,
    ``safeguards``, ``service_tier``, ``container``, ``mcp_servers``, ``thinking.display``.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty array")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid("'model' must be a string")
    chat_messages: list[dict[str, Any]] = []
    changes: list[dict[str, Any]] = []
    if body.get("system") is not None:
        text = system_text(body["system"], "system")
        if text:
            chat_messages.append({"role": "system", "content": text})
    for i, msg in enumerate(messages):
        chat_messages.extend(_message(msg, f"messages[{i}]", memory, changes))
    chat: dict[str, Any] = {"model": model, "messages": chat_messages} if model is not None else {"messages": chat_messages}
    raw_tools = body.get("tools")
    if raw_tools is not None and not isinstance(raw_tools, list):
        raise invalid("'tools' must be an array")
    tools = _resolve_tools([_tool(t, f"tools[{i}]") for i, t in enumerate(raw_tools)] if raw_tools else None, changes)
    if body.get("tool_choice") is not None:
        chat["tool_choice"], parallel = _tool_choice(body["tool_choice"])
        if parallel is not None:
            chat["parallel_tool_calls"] = parallel
    if tools:
        chat["tools"] = tools
        chat.setdefault("tool_choice", "auto")
    output_config = body.get("output_config")
    if isinstance(output_config, dict):
        fmt = output_config.get("format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
            chat["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "json_schema", "schema": fmt["schema"]}}
        if isinstance(output_config.get("effort"), str):
            chat["reasoning_effort"] = output_config["effort"]
    if count_only:
        return chat, DialectCall(model=model)
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise invalid("'max_tokens' must be a positive integer")
    chat["max_tokens"] = max_tokens
    for key in ("temperature", "top_p", "top_k"):
        if body.get(key) is not None:
            chat[key] = body[key]
    stop = body.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise invalid("'stop_sequences' must be an array of strings")
        chat["stop"] = stop
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled" and isinstance(thinking.get("budget_tokens"), int):
        chat["thinking_token_budget"] = thinking["budget_tokens"]
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid("'stream' must be a boolean")
    chat["stream"] = stream
    if stream:
        chat["stream_options"] = {"include_usage": True}
    return chat, DialectCall(model=model)
