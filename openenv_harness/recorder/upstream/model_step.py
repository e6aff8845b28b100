"""The trainer's own ``ModelStep`` as an engine (RFC 005 white-box mode, D8).

In white-box mode the trainer samples every turn itself. For an opaque CLI agent that means the
recorder's upstream for that session is the trainer's ``ModelStep`` -- ``(messages, tools,
sampling) -> ModelStepResult(response, prompt_ids, completion_ids, logprobs)`` -- instead of an
HTTP engine. This adapter turns the agent's chat body into that call and the result into the same
vLLM-shaped reply the HTTP path produces, so the flow, validation and records are identical.

``ModelStep`` is synchronous (it may run a whole forward pass), so it runs on a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable
from typing import Any

from openenv_harness.recorder.upstream.base import Upstream, UpstreamFailure, UpstreamReply

#: Request fields that are sampling parameters (passed to ``ModelStep`` as ``sampling``).
_SAMPLING_KEYS = (
    "temperature", "top_p", "top_k", "min_p", "max_tokens", "max_completion_tokens", "seed", "stop",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "chat_template_kwargs",
)


def _openenv_tools(tools: list[dict[str, Any]] | None) -> list[Any]:
    """OpenAI function tools → OpenEnv ``Tool`` objects (what ``ModelStep`` is typed to take)."""
    if not tools:
        return []
    from openenv.core.env_server.mcp_types import Tool  # white-box callers have OpenEnv loaded

    out = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not fn.get("name"):
            continue
        out.append(Tool(name=fn["name"], description=fn.get("description") or "",
                        input_schema=fn.get("parameters") or {"type": "object"}))
    return out


def reply_from_step(result: Any, model: str) -> dict[str, Any]:
    """A ``ModelStepResult`` as a vLLM chat reply (ids, ``token_id:N`` logprob tokens, usage)."""
    response = result.response
    tool_calls = [
        {
            "id": call.id or f"call_{secrets.token_hex(6)}",
            "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.args, ensure_ascii=False)},
        }
        for call in (response.tool_calls or [])
    ]
    message: dict[str, Any] = {"role": "assistant", "content": response.content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    completion = list(result.completion_ids)
    logprobs = list(result.logprobs)
    content = [{"token": f"token_id:{tid}", "logprob": lp} for tid, lp in zip(completion, logprobs, strict=False)]
    if len(logprobs) != len(completion):  # keep the mismatch visible to validation
        content = [{"token": f"token_id:{tid}", "logprob": lp} for tid, lp in zip(completion, logprobs, strict=False)] + [
            {"token": "token_id:?", "logprob": lp} for lp in logprobs[len(completion):]
        ]
    return {
        "id": f"chatcmpl-modelstep-{secrets.token_hex(8)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "prompt_token_ids": list(result.prompt_ids),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tool_calls else "stop",
                "token_ids": completion,
                "logprobs": {"content": content},
            }
        ],
        "usage": {
            "prompt_tokens": len(result.prompt_ids),
            "completion_tokens": len(completion),
            "total_tokens": len(result.prompt_ids) + len(completion),
        },
    }


class ModelStepUpstream(Upstream):
    """Wraps a ``ModelStep`` callable; ``sampling`` are the limits' sampling defaults."""

    def __init__(self, model_step: Callable[..., Any], *, sampling: dict[str, Any] | None = None,
                 name: str = "model_step") -> None:
        self._step = model_step
        self._sampling = dict(sampling or {})
        self.name = name

    async def chat(self, body: dict[str, Any], *, session_id: str, affinity: str | None = None) -> UpstreamReply:
        messages = body.get("messages") or []
        tools = _openenv_tools(body.get("tools"))
        sampling = {**{k: body[k] for k in _SAMPLING_KEYS if k in body}, **self._sampling}
        started = time.perf_counter()
        try:
            result = await asyncio.to_thread(self._step, messages, tools, sampling)
        except Exception as exc:  # the trainer's sampler failed: a server-side error for the agent
            raise UpstreamFailure("connect", f"model_step raised {type(exc).__name__}: {exc}") from exc
        reply = reply_from_step(result, str(body.get("model") or "model_step"))
        return UpstreamReply(status=200, json=reply, elapsed_ms=(time.perf_counter() - started) * 1000.0)
