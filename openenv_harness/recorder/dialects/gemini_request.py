"""A Google ``generateContent`` request (Gemini CLI) as a chat completions request.

The model and whether the call streams are in the URL (``models/<model>:generateContent`` or
``:streamGenerateContent``), not in the body, so the route hands them in. The body's parts map onto
chat messages one to one:

- ``systemInstruction`` (a Content, or a string) is the leading ``system`` message, its text parts
  joined with newlines, as Google's API concatenates them;
- a ``user`` turn's ``text`` and ``inlineData`` parts are the user message; its ``functionResponse``
  parts are ``tool`` messages (the ``response`` object as JSON text), ahead of the rest of the turn;
- a ``model`` turn's ``text`` parts are the assistant's content, ``thought`` parts its ``reasoning``
  (a part carrying only a ``thoughtSignature`` gets its text back from the replay memory), and each
  ``functionCall`` a tool call -- its ``args`` object replaced by the argument text the engine
  sampled when it is exactly what we sent (``ReplayMemory``), else ``json.dumps(args)``;
- ``tools[].functionDeclarations`` are the chat tools (``parametersJsonSchema`` as given; the
  OpenAPI-style ``parameters`` with its upper-case type names lower-cased to JSON Schema);
- ``toolConfig.functionCallingConfig`` is ``tool_choice`` (``ANY`` with one allowed name: that
  function; ``ANY``: ``required``; ``NONE``: ``none``), ``generationConfig`` the sampling fields.

Call ids: Google's ``functionCall.id`` is optional. We hand one out with every call; a history whose
calls carry none gets positional ids (``call_<turn>_<n>``) and its responses are paired with them
by order, so the chat history the template renders is consistent either way.

What cannot be translated faithfully -- an unknown part, ``fileData`` or executable code, a call
without a name, a ``cachedContent`` reference (no server state here) -- is a 400 in Google's error
shape: nothing reaches the engine or the store.
"""

from __future__ import annotations

import json
from typing import Any

from openenv_harness.recorder.dialects.base import invalid
from openenv_harness.recorder.dialects.dialect_call import DialectCall
from openenv_harness.recorder.dialects.memory import ReplayMemory

_PART_KINDS = ("text", "inlineData", "functionCall", "functionResponse")
_UNSUPPORTED_PARTS = ("fileData", "executableCode", "codeExecutionResult", "videoMetadata", "toolCall", "toolResponse")


def _parts(content: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(content, dict):
        raise invalid(f"{where} must be a Content object")
    parts = content.get("parts")
    if parts is None:
        return []
    if not isinstance(parts, list):
        raise invalid(f"{where}.parts must be an array")
    for i, part in enumerate(parts):
        if not isinstance(part, dict):
            raise invalid(f"{where}.parts[{i}] must be an object")
        for kind in _UNSUPPORTED_PARTS:
            if kind in part:
                raise invalid(f"{where}.parts[{i}]: {kind} parts are not supported")
    return parts


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise invalid(f"{where} must be a string")
    return value


def system_text(instruction: Any) -> str:
    """The text of ``systemInstruction``: a string, a lone text Part, or a Content whose text parts
    are joined."""
    if isinstance(instruction, str):
        return instruction
    if isinstance(instruction, dict) and "parts" not in instruction and "text" in instruction:
        return _text(instruction["text"], "systemInstruction.text")
    parts = _parts(instruction, "systemInstruction")
    texts = []
    for i, part in enumerate(parts):
        if "text" not in part:
            raise invalid(f"systemInstruction.parts[{i}]: a system instruction holds text parts only")
        texts.append(_text(part["text"], f"systemInstruction.parts[{i}].text"))
    return "\n".join(texts)


def _image(part: dict[str, Any], where: str) -> dict[str, Any]:
    data = part["inlineData"]
    if not isinstance(data, dict) or not isinstance(data.get("mimeType"), str) or not isinstance(data.get("data"), str):
        raise invalid(f"{where}.inlineData needs string 'mimeType' and 'data'")
    return {"type": "image_url", "image_url": {"url": f"data:{data['mimeType']};base64,{data['data']}"}}


def _call(part: dict[str, Any], where: str, call_id: str, memory: ReplayMemory) -> dict[str, Any]:
    fn = part["functionCall"]
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise invalid(f"{where}.functionCall needs a non-empty string 'name'")
    args = fn.get("args", {})
    if not isinstance(args, dict):
        raise invalid(f"{where}.functionCall.args must be a JSON object")
    arguments = memory.sampled_arguments(call_id, args)
    if arguments is None:
        arguments = json.dumps(args)
    return {"id": call_id, "type": "function", "function": {"name": fn["name"], "arguments": arguments}}


def _model_turn(parts: list[dict[str, Any]], where: str, turn: int, memory: ReplayMemory,
                pending: list[str]) -> dict[str, Any]:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, part in enumerate(parts):
        at = f"{where}.parts[{i}]"
        if "functionCall" in part:
            fn = part["functionCall"]
            given = fn.get("id") if isinstance(fn, dict) else None
            call_id = given if isinstance(given, str) and given else f"call_{turn}_{len(calls)}"
            calls.append(_call(part, at, call_id, memory))
        elif part.get("thought") is True:
            text = part.get("text")
            reasoning.append(_text(text, f"{at}.text") if text is not None
                             else memory.reasoning(part.get("thoughtSignature")) or "")
        elif "text" in part:
            texts.append(_text(part["text"], f"{at}.text"))
        elif "thoughtSignature" in part:
            reasoning.append(memory.reasoning(part["thoughtSignature"]) or "")
        else:
            raise invalid(f"{at}: a model turn holds text, thought and functionCall parts")
    pending[:] = [c["id"] for c in calls]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if any(reasoning):
        message["reasoning"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _user_turn(parts: list[dict[str, Any]], where: str, pending: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    content: list[dict[str, Any]] = []
    answered = 0
    for i, part in enumerate(parts):
        at = f"{where}.parts[{i}]"
        if "functionResponse" in part:
            fr = part["functionResponse"]
            if not isinstance(fr, dict) or not isinstance(fr.get("name"), str):
                raise invalid(f"{at}.functionResponse needs a string 'name'")
            given = fr.get("id")
            if isinstance(given, str) and given:
                call_id = given
            elif answered < len(pending):
                call_id = pending[answered]
            else:
                raise invalid(f"{at}.functionResponse answers no functionCall of the previous model turn")
            answered += 1
            response = fr.get("response", {})
            text = response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif "text" in part:
            content.append({"type": "text", "text": _text(part["text"], f"{at}.text")})
        elif "inlineData" in part:
            content.append(_image(part, at))
        else:
            raise invalid(f"{at}: a user turn holds text, inlineData and functionResponse parts")
    pending.clear()
    if content:
        if all(c["type"] == "text" for c in content):
            out.append({"role": "user", "content": "".join(c["text"] for c in content)})
        else:
            out.append({"role": "user", "content": content})
    return out


def _json_schema(schema: Any) -> Any:
    """Google's OpenAPI-style ``Schema`` as JSON Schema: type names lower-cased, all else kept."""
    if isinstance(schema, list):
        return [_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            out[key] = value.lower()
        elif key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: _json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "anyOf", "oneOf", "allOf", "not", "additionalProperties"):
            out[key] = _json_schema(value)
        else:
            out[key] = value
    return out


def _tools(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise invalid("'tools' must be an array")
    tools: list[dict[str, Any]] = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict):
            raise invalid(f"tools[{i}] must be an object")
        others = [k for k in tool if k != "functionDeclarations"]
        if others:
            raise invalid(f"tools[{i}]: only functionDeclarations are supported, not {others[0]!r}")
        declarations = tool.get("functionDeclarations") or []
        if not isinstance(declarations, list):
            raise invalid(f"tools[{i}].functionDeclarations must be an array")
        for j, fn in enumerate(declarations):
            where = f"tools[{i}].functionDeclarations[{j}]"
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                raise invalid(f"{where} needs a non-empty string 'name'")
            schema = fn.get("parametersJsonSchema")
            if schema is None:
                schema = _json_schema(fn.get("parameters")) if fn.get("parameters") is not None else None
            if schema is None:
                schema = {"type": "object", "properties": {}}
            if not isinstance(schema, dict):
                raise invalid(f"{where}: parameters must be a schema object")
            function: dict[str, Any] = {"name": fn["name"], "parameters": schema}
            if isinstance(fn.get("description"), str):
                function["description"] = fn["description"]
            tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(config: Any) -> Any:
    fcc = config.get("functionCallingConfig") if isinstance(config, dict) else None
    if not isinstance(fcc, dict):
        return None
    mode = fcc.get("mode", "AUTO")
    allowed = fcc.get("allowedFunctionNames")
    if mode in ("AUTO", "MODE_UNSPECIFIED", "VALIDATED"):
        return "auto"
    if mode == "NONE":
        return "none"
    if mode == "ANY":
        if isinstance(allowed, list) and len(allowed) == 1 and isinstance(allowed[0], str):
            return {"type": "function", "function": {"name": allowed[0]}}
        return "required"
    raise invalid("toolConfig.functionCallingConfig.mode must be one of AUTO, ANY, NONE, VALIDATED")


def _generation(config: Any, chat: dict[str, Any], *, count_only: bool) -> None:
    if config is None:
        return
    if not isinstance(config, dict):
        raise invalid("'generationConfig' must be an object")
    if config.get("responseMimeType") == "application/json":
        schema = config.get("responseJsonSchema") or config.get("responseSchema")
        if isinstance(schema, dict):
            schema = schema if "responseJsonSchema" in config else _json_schema(schema)
            chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
        else:
            chat["response_format"] = {"type": "json_object"}
    if count_only:
        return
    candidates = config.get("candidateCount")
    if candidates not in (None, 1):
        raise invalid("generationConfig.candidateCount must be 1 (one sample a call is recorded)")
    for google, name in (("temperature", "temperature"), ("topP", "top_p"), ("topK", "top_k"), ("seed", "seed"),
                         ("presencePenalty", "presence_penalty"), ("frequencyPenalty", "frequency_penalty")):
        if config.get(google) is not None:
            chat[name] = config[google]
    max_tokens = config.get("maxOutputTokens")
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise invalid("generationConfig.maxOutputTokens must be a positive integer")
        chat["max_tokens"] = max_tokens
    stop = config.get("stopSequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise invalid("generationConfig.stopSequences must be an array of strings")
        chat["stop"] = stop
    thinking = config.get("thinkingConfig")
    if isinstance(thinking, dict) and isinstance(thinking.get("thinkingBudget"), int) and thinking["thinkingBudget"] > 0:
        chat["thinking_token_budget"] = thinking["thinkingBudget"]


def to_chat(body: dict[str, Any], memory: ReplayMemory, *, model: str | None, stream: bool,
            count_only: bool = False) -> tuple[dict[str, Any], DialectCall]:
    """The chat request for a ``generateContent`` body (``count_only``: a countTokens body).

    Dropped because a chat engine has no counterpart: ``safetySettings``, ``labels``,
    ``generationConfig.thinkingConfig.includeThoughts`` and ``responseModalities``.
    """
    if count_only and isinstance(body.get("generateContentRequest"), dict):
        body = body["generateContentRequest"]
    if body.get("cachedContent") is not None:
        raise invalid("'cachedContent' is not supported: send the whole conversation")
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise invalid("'contents' must be a non-empty array")
    messages: list[dict[str, Any]] = []
    if body.get("systemInstruction") is not None:
        text = system_text(body["systemInstruction"])
        if text:
            messages.append({"role": "system", "content": text})
    pending: list[str] = []
    for i, content in enumerate(contents):
        where = f"contents[{i}]"
        parts = _parts(content, where)
        role = content.get("role", "user")
        if role == "model":
            messages.append(_model_turn(parts, where, i, memory, pending))
        elif role in ("user", "function"):
            messages.extend(_user_turn(parts, where, pending))
        else:
            raise invalid(f"{where}.role must be 'user' or 'model'")
    chat: dict[str, Any] = {"messages": messages}
    if model is not None:
        chat["model"] = model
    tools = _tools(body["tools"]) if body.get("tools") is not None else []
    if tools:
        chat["tools"] = tools
        chat["tool_choice"] = _tool_choice(body.get("toolConfig")) or "auto"
    _generation(body.get("generationConfig"), chat, count_only=count_only)
    if not count_only:
        chat["stream"] = stream
        if stream:
            chat["stream_options"] = {"include_usage": True}
    return chat, DialectCall(model=model)
