"""Synthesize an OpenAI SSE stream from a complete chat completion (D6).

Why synthesize: the recorder calls the engine without streaming (the token evidence must be whole
and recorded before anything is sent), but CLI agents always ask to stream, and a JSON body where
SSE was asked for makes OpenCode loop forever and Pi end silently. So the whole
reply is replayed as a stream that mirrors vLLM's chunk order: role, reasoning, content, tool-call
deltas (index, id, type and name first, then the arguments), a chunk with a real ``finish_reason``,
the usage chunk when asked, then ``[DONE]``. The stream is built only after the record committed,
so a terminal event can never precede durability (D14).
"""

from __future__ import annotations

from typing import Any

import orjson

_REASONING_FIELDS = ("reasoning", "reasoning_content")


def _frame(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def finish_reason_for(message: dict[str, Any], reported: str | None) -> str:
    """A non-null finish reason, always: the engine's, else inferred from the message."""
    if reported:
        return reported
    return "tool_calls" if message.get("tool_calls") else "stop"


def synthesize_sse(reply: dict[str, Any], *, include_usage: bool) -> bytes:
    """The SSE body (``data: ...`` frames and the ``[DONE]`` sentinel) for one complete reply."""
    base = {
        "id": reply.get("id") or "chatcmpl-recorded",
        "object": "chat.completion.chunk",
        "created": reply.get("created") or 0,
        "model": reply.get("model") or "",
    }
    if reply.get("system_fingerprint") is not None:
        base["system_fingerprint"] = reply["system_fingerprint"]
    choice = (reply.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    index = choice.get("index", 0)

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> bytes:
        c: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return _frame({**base, "choices": [c]})

    parts = [chunk({"role": "assistant", "content": ""})]
    for name in _REASONING_FIELDS:
        text = message.get(name)
        if text:
            parts.append(chunk({name: text}))
    content = message.get("content")
    if content:
        parts.append(chunk({"content": content}, logprobs=choice.get("logprobs")))
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") or {}
        head = {
            "index": i,
            "id": call.get("id") or f"call_{i}",
            "type": call.get("type") or "function",
            "function": {"name": fn.get("name", ""), "arguments": ""},
        }
        parts.append(chunk({"tool_calls": [head]}))
        args = fn.get("arguments")
        if args:
            parts.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args}}]}))
    parts.append(chunk({}, finish=finish_reason_for(message, choice.get("finish_reason"))))
    usage = reply.get("usage")
    if include_usage:
        parts.append(_frame({**base, "choices": [], "usage": usage or {}}))
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)
