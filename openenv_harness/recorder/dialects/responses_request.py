"""A Responses API request (``POST /v1/responses``, Codex) as a chat completions request.

The item-to-message conventions follow vLLM's own Responses route (``construct_input_messages``):
``instructions`` become the leading system message; message items keep their role and text; a
reasoning item, an assistant message and the function calls of one turn merge into one assistant
message (``reasoning``, ``content``, ``tool_calls``); a ``function_call_output`` is a ``tool`` message.
Two choices differ, and why:

- ``developer`` messages become ``system`` messages: many chat templates (Qwen's among them) know
  no ``developer`` role and would drop Codex's instructions silently; Pi's ``supportsDeveloperRole:
  false`` exists for the same reason.
- hosted tools (``web_search``, ``file_search``, ...), ``namespace`` and ``custom`` tools are left
  out: a chat engine can neither show nor run them. The record's ``request`` shows the tool list
  the model really saw. The Codex preset turns those tools off.

Replay: Codex sends the function-call ``arguments`` and the reasoning text back verbatim, so its
chains are followed token by token as they are; a client that re-serializes arguments (same JSON,
other text) gets the sampled text back from ``ReplayMemory``, and a reasoning item that returns
with only our ``encrypted_content`` gets its sampled text back the same way. There is no server
state: ``previous_response_id``, ``conversation`` and ``background`` are refused with a 400 (send
the whole conversation, ``store: false``, as Codex does).
"""

from __future__ import annotations

import json
from typing import Any

from openenv_harness.recorder.dialects.base import invalid
from openenv_harness.recorder.dialects.dialect_call import DialectCall
from openenv_harness.recorder.dialects.memory import ReplayMemory

_TEXT_PARTS = {"input_text", "output_text", "text", "summary_text", "reasoning_text"}
_ROLES = {"user", "system", "developer", "assistant"}


def comparable(arguments: Any) -> Any:
    """Arguments as compared for replay: parsed JSON when they parse, else the text itself."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    """Message content as chat content: a string, or text/image parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where} must be a string or an array of content parts")
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS or kind == "refusal":
            text = part.get("text") if kind != "refusal" else part.get("refusal")
            if not isinstance(text, str):
                raise invalid(f"{where}[{i}].text must be a string")
            parts.append({"type": "text", "text": text})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise invalid(f"{where}[{i}]: only input_image parts with an image_url are supported")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise invalid(f"{where}[{i}]: unsupported content part type {kind!r}")
    return parts


def _flat(parts: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if isinstance(parts, list) and len(parts) == 1 and parts[0]["type"] == "text":
        text: str = parts[0]["text"]  # ``_parts`` made it, from a checked string
        return text
    return parts


def _reasoning(item: dict[str, Any], where: str, memory: ReplayMemory) -> str:
    texts = [p.get("text") for p in item.get("content") or [] if isinstance(p, dict)]
    if texts and all(isinstance(t, str) for t in texts):
        return "\n".join(texts)  # type: ignore[arg-type]
    remembered = memory.reasoning(item.get("encrypted_content"))
    if remembered is not None:
        return remembered
    if item.get("encrypted_content"):
        raise invalid(f"{where}: encrypted reasoning that this recorder did not produce cannot be read")
    summary = [p.get("text") for p in item.get("summary") or [] if isinstance(p, dict)]
    return "\n".join(t for t in summary if isinstance(t, str))


def _assistant_tail(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    return messages[-1] if messages and messages[-1].get("role") == "assistant" else None


def _item(item: Any, where: str, messages: list[dict[str, Any]], memory: ReplayMemory) -> None:
    if not isinstance(item, dict):
        raise invalid(f"{where} must be an object")
    kind = item.get("type", "message" if "role" in item else None)
    tail = _assistant_tail(messages)
    if kind == "message":
        role = item.get("role")
        if role not in _ROLES:
            raise invalid(f"{where}.role must be one of {', '.join(sorted(_ROLES))}")
        content = _flat(_parts(item.get("content"), f"{where}.content"))
        if role == "assistant":
            if tail is not None and not tail.get("content") and not tail.get("tool_calls"):
                tail["content"] = content
                return
            messages.append({"role": "assistant", "content": content})
            return
        messages.append({"role": "system" if role == "developer" else role, "content": content})
    elif kind == "reasoning":
        text = _reasoning(item, where, memory)
        if tail is not None and "reasoning" not in tail and not tail.get("content") and not tail.get("tool_calls"):
            tail["reasoning"] = text
            return
        messages.append({"role": "assistant", "content": "", "reasoning": text})
    elif kind == "function_call":
        call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
        if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
            raise invalid(f"{where} needs a non-empty string 'call_id' and 'name'")
        if not isinstance(arguments, str):
            raise invalid(f"{where}.arguments must be a string")
        sampled = memory.sampled_arguments(call_id, comparable(arguments))
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": sampled or arguments}}
        if tail is not None:
            tail.setdefault("tool_calls", []).append(call)
            return
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str) or not call_id:
            raise invalid(f"{where}.call_id must be a non-empty string")
        content = output if isinstance(output, str) else _flat(_parts(output, f"{where}.output"))
        messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
    else:
        raise invalid(f"{where}: unsupported input item type {kind!r}")


def _tools(tools: Any) -> tuple[list[dict[str, Any]], list[str]]:
    if not isinstance(tools, list):
        raise invalid("'tools' must be an array")
    out, dropped = [], []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise invalid(f"tools[{i}] must be an object with a string 'type'")
        if tool["type"] != "function":
            dropped.append(tool["type"])
            continue
        name, params = tool.get("name"), tool.get("parameters")
        if not isinstance(name, str) or not name:
            raise invalid(f"tools[{i}].name must be a non-empty string")
        if params is not None and not isinstance(params, dict):
            raise invalid(f"tools[{i}].parameters must be a JSON Schema object")
        function: dict[str, Any] = {"name": name, "description": tool.get("description"),
                                    "parameters": params or {"type": "object", "properties": {}}}
        if tool.get("strict") is True:
            function["strict"] = True
        out.append({"type": "function", "function": function})
    return out, dropped


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise invalid("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...}")


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    if fmt["type"] == "json_schema" and isinstance(fmt.get("schema"), dict):
        schema = {"name": fmt.get("name") or "response", "schema": fmt["schema"]}
        if fmt.get("strict") is not None:
            schema["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": schema}
    raise invalid("text.format must be text, json_object or json_schema with a schema")


def to_chat(body: dict[str, Any], memory: ReplayMemory) -> tuple[dict[str, Any], DialectCall]:
    """The chat request for a Responses request.

    Dropped because a chat engine has no counterpart: ``store``, ``include``, ``prompt_cache_key``,
    ``client_metadata``, ``metadata``, ``user``, ``service_tier``, ``truncation``, ``reasoning.summary``.
    """
    for field in ("previous_response_id", "conversation", "prompt"):
        if body.get(field):
            raise invalid(f"'{field}' is not supported: this recorder keeps no response state; send the whole "
                          "conversation in 'input' (store: false)", f"unsupported_{field}")
    if body.get("background"):
        raise invalid("'background' responses are not supported", "unsupported_background")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid("'model' must be a string")
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions:
        if not isinstance(instructions, str):
            raise invalid("'instructions' must be a string")
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list) and items:
        for i, item in enumerate(items):
            _item(item, f"input[{i}]", messages, memory)
    else:
        raise invalid("'input' must be a string or a non-empty array of items")
    if not messages:
        raise invalid("the request holds no message the model could read")
    chat: dict[str, Any] = {"model": model, "messages": messages} if model is not None else {"messages": messages}
    dropped: list[str] = []
    if body.get("tools"):
        tools, dropped = _tools(body["tools"])
        if tools:
            chat["tools"] = tools
    if body.get("tool_choice") is not None and chat.get("tools"):
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if isinstance(body.get("parallel_tool_calls"), bool) and chat.get("tools"):
        chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    max_output = body.get("max_output_tokens")
    if max_output is not None:
        if not isinstance(max_output, int) or isinstance(max_output, bool) or max_output < 1:
            raise invalid("'max_output_tokens' must be a positive integer")
        chat["max_tokens"] = max_output
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            chat[key] = body[key]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        chat["reasoning_effort"] = reasoning["effort"]
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid("'stream' must be a boolean")
    chat["stream"] = stream
    if stream:
        chat["stream_options"] = {"include_usage": True}
    echo = {"tool_choice": body.get("tool_choice", "auto"), "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "dropped_tools": dropped}
    return chat, DialectCall(model=model, echo=echo)
