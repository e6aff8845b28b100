"""The Anthropic Messages dialect (Claude Code): replies, event streams and errors.

The request end is ``anthropic_request.to_chat``. The reply end turns one recorded chat completion
into a Messages reply: a ``thinking`` block (the engine's reasoning, with a signature we make up
and remember), a ``text`` block, one ``tool_use`` block per tool call (``input`` the parsed
arguments, and the sampled argument text remembered under the call id), ``stop_reason`` mapped
the way vLLM's route maps it, and usage. Streamed, it is Anthropic's typed event protocol --
``message_start``, ``content_block_start``/``_delta``/``_stop`` (``thinking_delta`` then
``signature_delta``; ``text_delta``; ``input_json_delta`` carrying the sampled argument text),
``message_delta`` with ``stop_reason`` and usage, ``message_stop`` -- built in one piece after the
record committed, so ``message_stop`` can never precede durability.

Errors: ``{"type": "error", "error": {"type", "message"}}`` with the same status and Retry-After.
Anthropic's SDK retries 408/409/429/5xx on its own and obeys ``x-should-retry``; every 4xx but
408 and 429 says ``x-should-retry: false``, so a budget stop or a closed session (409) ends Claude
Code at once instead of after its retries.
"""

from __future__ import annotations

import json
import time
from typing import Any, ClassVar

import orjson
from starlette.responses import Response

from openenv_harness.recorder.dialects import anthropic_request
from openenv_harness.recorder.dialects.base import Dialect, chat_message, reasoning_text, sse
from openenv_harness.recorder.dialects.dialect_call import DialectCall
from openenv_harness.recorder.dialects.memory import ReplayMemory, reasoning_handle
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.upstream.base import UpstreamReply

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large",
                422: "invalid_request_error", 429: "rate_limit_error", 501: "api_error", 503: "overloaded_error"}
#: 4xx statuses worth the SDK's own retry; our 409 means "session closed", which no retry mends.
_RETRYABLE_4XX = {408, 429}


def error_type(status: int) -> str:
    return _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


def anthropic_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    out = dict(headers or {})
    if status < 500 and status not in _RETRYABLE_4XX:
        out["x-should-retry"] = "false"
    body = {"type": "error", "error": {"type": error_type(status), "message": message}}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=out)


def _suffix(reply: dict[str, Any]) -> str:
    rid = str(reply.get("id") or "recorded")
    return rid.removeprefix("chatcmpl-")


def _arguments_object(arguments: Any) -> tuple[dict[str, Any], str]:
    """``(input, partial_json)``: the parsed arguments, and the text streamed for them."""
    if isinstance(arguments, str) and arguments.strip():
        try:
            parsed = json.loads(arguments)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed, arguments  # the sampled text itself, verbatim
    return {}, "{}"  # not a JSON object: the client gets {} (the sampled text stays in the record)


def _usage(reply: dict[str, Any]) -> dict[str, int]:
    raw_usage = reply.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    prompt = usage.get("prompt_tokens") or 0
    raw_details = usage.get("prompt_tokens_details")
    details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
    cached = details.get("cached_tokens") or 0
    return {"input_tokens": max(0, prompt - cached), "output_tokens": usage.get("completion_tokens") or 0,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def stop_reason(choice: dict[str, Any], has_tool_use: bool) -> tuple[str, str | None]:
    finish = choice.get("finish_reason")
    if finish == "length":
        return "max_tokens", None
    if has_tool_use:
        return "tool_use", None
    matched = choice.get("stop_reason")
    if isinstance(matched, str):
        return "stop_sequence", matched
    return "end_turn", None


def content_blocks(reply: dict[str, Any], call: DialectCall, memory: ReplayMemory) -> list[tuple[dict[str, Any], str]]:
    """``[(block, streamed text)]`` for one chat completion; remembers what replay must restore."""
    _, message = chat_message(reply)
    blocks: list[tuple[dict[str, Any], str]] = []
    reasoning = reasoning_text(message)
    if reasoning:
        handle = reasoning_handle(str(reply.get("id")), reasoning)
        memory.remember_reasoning(handle, reasoning)
        blocks.append(({"type": "thinking", "thinking": reasoning, "signature": handle}, reasoning))
    content = message.get("content")
    if isinstance(content, str) and content:
        blocks.append(({"type": "text", "text": content}, content))
    for i, tool_call in enumerate(message.get("tool_calls") or []):
        fn = tool_call.get("function") or {}
        call_id = tool_call.get("id") or f"toolu_{_suffix(reply)}_{i}"
        arguments = call.arguments_for(i, call_id, fn.get("arguments"), memory)
        tool_input, partial = _arguments_object(arguments)
        memory.remember_call(call_id, arguments if isinstance(arguments, str) else partial, tool_input)
        blocks.append(({"type": "tool_use", "id": call_id, "name": fn.get("name") or "", "input": tool_input}, partial))
    if not blocks:
        blocks.append(({"type": "text", "text": ""}, ""))
    return blocks


def anthropic_models(engine_list: dict[str, Any]) -> dict[str, Any]:
    """The engine's OpenAI-shaped model list in Anthropic's ``GET /v1/models`` shape."""
    cards = [c for c in engine_list.get("data") or [] if isinstance(c, dict) and isinstance(c.get("id"), str)]
    data = [{"type": "model", "id": c["id"], "display_name": c["id"],
             "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(c.get("created") or 0))} for c in cards]
    return {"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


class AnthropicDialect(Dialect):
    name: ClassVar[str] = "anthropic"
    path_suffix: ClassVar[str] = "/v1/messages"
    session_header: ClassVar[str] = "x-claude-code-session-id"
    keepalive_event: ClassVar[bytes] = b'event: ping\ndata: {"type":"ping"}\n\n'  # as Anthropic's API sends

    def to_chat(self, body: dict[str, Any], memory: ReplayMemory) -> tuple[dict[str, Any], DialectCall]:
        return anthropic_request.to_chat(body, memory)

    def _shell(self, reply: dict[str, Any], call: DialectCall) -> dict[str, Any]:
        return {"id": f"msg_{_suffix(reply)}", "type": "message", "role": "assistant",
                "model": call.model or reply.get("model") or ""}

    def message(self, reply: dict[str, Any], call: DialectCall, memory: ReplayMemory) -> dict[str, Any]:
        blocks = [block for block, _ in content_blocks(reply, call, memory)]
        choice, _ = chat_message(reply)
        reason, sequence = stop_reason(choice, any(b["type"] == "tool_use" for b in blocks))
        return {**self._shell(reply, call), "content": blocks, "stop_reason": reason, "stop_sequence": sequence,
                "usage": _usage(reply)}

    def stream(self, reply: dict[str, Any], call: DialectCall, memory: ReplayMemory) -> bytes:
        blocks = content_blocks(reply, call, memory)
        choice, _ = chat_message(reply)
        reason, sequence = stop_reason(choice, any(b["type"] == "tool_use" for b, _ in blocks))
        usage = _usage(reply)
        start = {**self._shell(reply, call), "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": {**usage, "output_tokens": 0}}
        out = [sse("message_start", {"type": "message_start", "message": start})]
        for index, (block, text) in enumerate(blocks):
            kind = block["type"]
            opening: dict[str, Any]
            if kind == "thinking":
                opening = {"type": "thinking", "thinking": "", "signature": ""}
                deltas = [{"type": "thinking_delta", "thinking": text},
                          {"type": "signature_delta", "signature": block["signature"]}]
            elif kind == "text":
                opening, deltas = {"type": "text", "text": ""}, ([{"type": "text_delta", "text": text}] if text else [])
            else:
                opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                deltas = [{"type": "input_json_delta", "partial_json": text}]
            out.append(sse("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": opening}))
            out.extend(sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
                       for d in deltas)
            out.append(sse("content_block_stop", {"type": "content_block_stop", "index": index}))
        out.append(sse("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                         "usage": {"output_tokens": usage["output_tokens"]}}))
        out.append(sse("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def error(self, exc: AgentError) -> Response:
        return anthropic_error(exc.status, exc.message, exc.headers)

    def models(self, engine_reply: UpstreamReply) -> Response:
        """Claude Code with gateway model discovery on reads the list in Anthropic's shape."""
        if engine_reply.status == 200 and isinstance(engine_reply.json, dict):
            return Response(orjson.dumps(anthropic_models(engine_reply.json)), media_type="application/json")
        return super().models(engine_reply)

    def stream_error(self, response: Response) -> bytes:
        """Anthropic's in-stream ``error`` event carries the same body as its error response."""
        try:
            body = orjson.loads(bytes(response.body))
        except orjson.JSONDecodeError:
            body = None
        if not (isinstance(body, dict) and isinstance(body.get("error"), dict)):
            body = {"type": "error", "error": {"type": error_type(response.status_code),
                                               "message": bytes(response.body).decode("utf-8", "replace")}}
        return sse("error", body)


ANTHROPIC = AnthropicDialect()
