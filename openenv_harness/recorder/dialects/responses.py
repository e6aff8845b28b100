"""The Responses dialect (Codex): response objects, the typed event stream, errors.

The request end is ``responses_request.to_chat``. The reply end turns one recorded chat completion
into a response whose ``output`` holds, in the order the model produced them, a ``reasoning`` item
(the engine's reasoning as ``reasoning_text`` content, with an ``encrypted_content`` handle we make
up and remember), a ``message`` item with the text, and one ``function_call`` item per tool call
(the engine's argument text verbatim, remembered under its ``call_id``). A reply cut by the token
limit is ``status: incomplete`` with ``incomplete_details.reason = max_output_tokens``.

Streamed, it is the Responses event protocol Codex reads: ``response.created``,
``response.in_progress``, per item ``response.output_item.added`` ... ``response.output_item.done``
(with ``response.reasoning_text.delta/done``, ``response.content_part.added/done`` around
``response.output_text.delta/done``, ``response.function_call_arguments.delta/done``), then
``response.completed`` (or ``response.incomplete``), each with its ``sequence_number`` -- built in one
piece after the record committed, so the terminal event never precedes durability.

Errors keep the OpenAI error shape (``{"error": {message, type, param, code}}``) that Codex and the
OpenAI SDKs read, with the status and Retry-After the flow chose.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, ClassVar

import orjson
from starlette.responses import Response

from openenv_harness.recorder.dialects import responses_request
from openenv_harness.recorder.dialects.base import Dialect, chat_message, reasoning_text, sse
from openenv_harness.recorder.dialects.dialect_call import DialectCall
from openenv_harness.recorder.dialects.memory import ReplayMemory, reasoning_handle
from openenv_harness.recorder.errors import AgentError


def _suffix(reply: dict[str, Any]) -> str:
    return str(reply.get("id") or "recorded").removeprefix("chatcmpl-")


def _usage(reply: dict[str, Any]) -> dict[str, Any]:
    raw_usage = reply.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    raw_details = usage.get("prompt_tokens_details")
    details: dict[str, Any] = raw_details if isinstance(raw_details, dict) else {}
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": details.get("cached_tokens") or 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


def output_items(reply: dict[str, Any], call: DialectCall, memory: ReplayMemory) -> list[dict[str, Any]]:
    """The response's output items for one chat completion; remembers what replay must restore."""
    _, message = chat_message(reply)
    suffix = _suffix(reply)
    items: list[dict[str, Any]] = []
    reasoning = reasoning_text(message)
    if reasoning:
        handle = reasoning_handle(str(reply.get("id")), reasoning)
        memory.remember_reasoning(handle, reasoning)
        items.append({"id": f"rs_{suffix}", "type": "reasoning", "summary": [],
                      "content": [{"type": "reasoning_text", "text": reasoning}], "encrypted_content": handle})
    content = message.get("content")
    if isinstance(content, str) and content:
        items.append({"id": f"msg_{suffix}", "type": "message", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": content, "annotations": [], "logprobs": []}]})
    for i, tool_call in enumerate(message.get("tool_calls") or []):
        fn = tool_call.get("function") or {}
        call_id = tool_call.get("id") or f"call_{suffix}_{i}"
        arguments = call.arguments_for(i, call_id, fn.get("arguments"), memory)
        arguments = arguments if isinstance(arguments, str) else "{}"
        memory.remember_call(call_id, arguments, responses_request.comparable(arguments))
        items.append({"id": f"fc_{call_id}", "type": "function_call", "status": "completed", "call_id": call_id,
                      "name": fn.get("name") or "", "arguments": arguments})
    return items


class ResponsesDialect(Dialect):
    name: ClassVar[str] = "responses"
    path_suffix: ClassVar[str] = "/v1/responses"
    session_header: ClassVar[str] = "session-id"

    def to_chat(self, body: dict[str, Any], memory: ReplayMemory) -> tuple[dict[str, Any], DialectCall]:
        return responses_request.to_chat(body, memory)

    def _response(self, reply: dict[str, Any], call: DialectCall, output: list[dict[str, Any]],
                  status: str) -> dict[str, Any]:
        choice, _ = chat_message(reply)
        incomplete = choice.get("finish_reason") == "length"
        final = status != "in_progress"
        return {
            "id": f"resp_{_suffix(reply)}", "object": "response",
            "created_at": reply.get("created") or int(time.time()),
            "status": ("incomplete" if incomplete else "completed") if final else status,
            "model": call.model or reply.get("model") or "",
            "output": output if final else [],
            "usage": _usage(reply) if final else None,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if final and incomplete else None,
            "instructions": None, "metadata": {}, "temperature": None, "top_p": None,
            "tool_choice": call.echo.get("tool_choice", "auto"),
            "parallel_tool_calls": call.echo.get("parallel_tool_calls", True),
            "tools": [], "text": {"format": {"type": "text"}}, "store": False,
        }

    def message(self, reply: dict[str, Any], call: DialectCall, memory: ReplayMemory) -> dict[str, Any]:
        return self._response(reply, call, output_items(reply, call, memory), "completed")

    def stream(self, reply: dict[str, Any], call: DialectCall, memory: ReplayMemory) -> bytes:
        items = output_items(reply, call, memory)
        seq = itertools.count()
        out: list[bytes] = []

        def event(kind: str, **fields: Any) -> None:
            out.append(sse(kind, {"type": kind, "sequence_number": next(seq), **fields}))

        pending = self._response(reply, call, [], "in_progress")
        event("response.created", response=pending)
        event("response.in_progress", response=pending)
        for index, item in enumerate(items):
            kind, ids = item["type"], {"item_id": item["id"], "output_index": index}
            if kind == "reasoning":
                event("response.output_item.added", output_index=index, item={**item, "content": []})
                text = item["content"][0]["text"]
                event("response.reasoning_text.delta", content_index=0, delta=text, **ids)
                event("response.reasoning_text.done", content_index=0, text=text, **ids)
            elif kind == "message":
                event("response.output_item.added", output_index=index,
                      item={**item, "status": "in_progress", "content": []})
                part = item["content"][0]
                event("response.content_part.added", content_index=0, part={**part, "text": ""}, **ids)
                event("response.output_text.delta", content_index=0, delta=part["text"], logprobs=[], **ids)
                event("response.output_text.done", content_index=0, text=part["text"], logprobs=[], **ids)
                event("response.content_part.done", content_index=0, part=part, **ids)
            else:
                event("response.output_item.added", output_index=index,
                      item={**item, "status": "in_progress", "arguments": ""})
                event("response.function_call_arguments.delta", delta=item["arguments"], **ids)
                event("response.function_call_arguments.done", arguments=item["arguments"], **ids)
            event("response.output_item.done", output_index=index, item=item)
        final = self._response(reply, call, items, "completed")
        event("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)
        return b"".join(out)

    def error(self, exc: AgentError) -> Response:
        return exc.to_response()

    def stream_error(self, response: Response) -> bytes:
        """A failed response as the stream's terminal ``response.failed`` event, with the error's code
        and message (what Codex reads to decide whether to retry)."""
        try:
            error = orjson.loads(bytes(response.body)).get("error") or {}
        except (orjson.JSONDecodeError, AttributeError):
            error = {}
        message = error.get("message") or bytes(response.body).decode("utf-8", "replace") or f"HTTP {response.status_code}"
        failed = {"id": f"resp_failed_{response.status_code}", "object": "response", "status": "failed", "output": [],
                  "error": {"code": error.get("code") or error.get("type") or "server_error", "message": message}}
        return sse("response.failed", {"type": "response.failed", "sequence_number": 0, "response": failed})


RESPONSES = ResponsesDialect()
