"""A lean engine for the recorder benchmark: vLLM's chat wire format with no model work.

Why not the reference engine: it runs a real BPE tokenizer and a real Jinja chat template, and at
8k-token prompts on a 2-core machine that work would dominate every measurement. A benchmark of a
proxy needs an upstream that is cheap and deterministic, yet whose replies are shaped exactly like
vLLM's (top-level ``prompt_token_ids``, ``choices[0].token_ids``, ``logprobs.content[{token,
logprob}]`` with ``token_id:N`` strings, ``usage``), so the proxy does all of its real work.

The "tokenizer" maps 4 bytes of UTF-8 to one id (the first two bytes read as a little-endian
uint16, so ids look like a real vocabulary's) and a message renders as ``[ROLE] enc(text) [EOS]``,
with ``[ASSISTANT]`` as the generation prompt. Every reply is one tool call of exactly
``completion_tokens`` ids (text ids plus ``[EOS]``) whose text re-renders to the same ids, so the
next turn's prompt starts with this turn's prompt + completion, as with a real engine.

Two prompt modes:

- ``chain``: ``prompt_token_ids`` is the whole rendered conversation (it grows turn by turn).
- ``fixed``: ``prompt_token_ids`` is exactly ``prompt_tokens`` ids on every call (a sliding window
  over the rendered conversation, left-padded when shorter): the unlinked, fixed-size workload.

Run it: ``python benchmarks/lean_engine.py --mode chain --port 8011``.
"""

from __future__ import annotations

import argparse
import time
import uuid
from array import array
from dataclasses import dataclass
from typing import Any
from collections.abc import Awaitable, Callable

import orjson

try:  # zero-copy id arrays in replies (orjson serializes numpy arrays natively)
    import numpy as _np
except ImportError:  # pragma: no cover - numpy is optional; lists work, a little slower
    _np = None

PAD, EOS, ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL = 0, 1, 2, 3, 4, 5
ROLE_IDS = {"system": ROLE_SYSTEM, "developer": ROLE_SYSTEM, "user": ROLE_USER, "assistant": ROLE_ASSISTANT,
            "tool": ROLE_TOOL}
CHARS_PER_TOKEN = 4
MODEL = "fake-model"
ENGINE_VERSION = "0.0-lean"

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class EngineConfig:
    mode: str = "chain"  # chain | fixed
    prompt_tokens: int = 1024  # fixed mode: every prompt is exactly this long
    completion_tokens: int = 50  # text ids + [EOS]

    def __post_init__(self) -> None:
        if self.mode not in ("chain", "fixed"):
            raise ValueError("mode must be 'chain' or 'fixed'")
        if self.prompt_tokens < 1 or self.completion_tokens < 2:
            raise ValueError("prompt_tokens >= 1 and completion_tokens >= 2 are required")


# -- the 4-bytes-per-id tokenizer ----------------------------------------------------------------


def encode(text: str) -> array:
    """One uint16 id per 4 UTF-8 bytes (space-padded): C-speed, no per-token Python loop."""
    data = text.encode("utf-8")
    rest = len(data) % CHARS_PER_TOKEN
    if rest:
        data += b" " * (CHARS_PER_TOKEN - rest)
    halves = array("H")
    halves.frombytes(data)
    return halves[::2]


def message_text(message: dict[str, Any]) -> str:
    """The text a message renders: its content, then its tool calls in a fixed markup."""
    content = message.get("content")
    if isinstance(content, list):
        text = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    else:
        text = content if isinstance(content, str) else ""
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        text += f"<tool_call>{fn.get('name', '')} {fn.get('arguments', '')}</tool_call>"
    return text


def render(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> array:
    """``[ROLE] enc(text) [EOS]`` per message, then ``[ASSISTANT]``."""
    out = array("H")
    for message in messages:
        out.append(ROLE_IDS.get(message.get("role", ""), ROLE_USER))
        out.extend(encode(message_text(message)))
        out.append(EOS)
    if add_generation_prompt:
        out.append(ROLE_ASSISTANT)
    return out


def window(ids: array, size: int) -> array:
    """Exactly ``size`` ids: the last ``size`` of the render, left-padded when it is shorter."""
    if len(ids) >= size:
        return ids[len(ids) - size :]
    return array("H", [PAD]) * (size - len(ids)) + ids


# -- the reply -------------------------------------------------------------------------------------


def tool_call_text(call_number: int, text_tokens: int) -> tuple[str, str]:
    """``(arguments, rendered text)`` of a bash call whose rendering is exactly ``text_tokens`` ids."""
    head, tail = '<tool_call>bash {"command":"', '"}</tool_call>'
    width = text_tokens * CHARS_PER_TOKEN - len(head) - len(tail)
    if width < 8:
        raise ValueError("completion_tokens too small for a tool call")
    command = f"cat src/module_{call_number}.py | grep -n def"
    command = (command + " " * width)[:width]
    arguments = '{"command":"' + command + '"}'
    return arguments, head + command + tail


def _logprob(token_id: int, position: int, temperature: float) -> float:
    # Deterministic, strictly negative, and scaled by 1/T like processed (post-temperature) values.
    return -(0.05 + ((token_id * 2654435761 + position * 40503) % 997) / 400.0) / max(temperature, 1e-3)


def _logprob_entry(token_id: int, position: int, temperature: float, top: int) -> dict[str, Any]:
    token = f"token_id:{token_id}"
    value = _logprob(token_id, position, temperature)
    entry: dict[str, Any] = {"token": token, "logprob": value, "bytes": None, "top_logprobs": []}
    if top > 0:
        entry["top_logprobs"] = [{"token": token, "logprob": value, "bytes": None}] + [
            {"token": f"token_id:{token_id + k}", "logprob": value - 1.5 * k / max(temperature, 1e-3), "bytes": None}
            for k in range(1, top)
        ]
    return entry


class LeanEngine:
    """The ASGI app. State is a call counter (it makes every tool call distinct)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.calls = 0

    def prompt_ids(self, messages: list[dict[str, Any]]) -> array:
        ids = render(messages)
        if self.config.mode == "fixed":
            return window(ids, self.config.prompt_tokens)
        return ids

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """A vLLM ``chat.completion`` body for one request (non-streamed form)."""
        self.calls += 1
        prompt = self.prompt_ids(body["messages"])
        n = self.config.completion_tokens
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        arguments, text = tool_call_text(self.calls, n - 1)
        ids = encode(text)
        ids.append(EOS)
        message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None, "annotations": None,
                                   "audio": None, "function_call": None}
        finish = "tool_calls"
        if isinstance(limit, int) and 0 < limit < n:
            ids = ids[:limit]
            message["content"] = text[: limit * CHARS_PER_TOKEN]
            finish = "length"
        else:
            message["tool_calls"] = [{"id": f"chatcmpl-tool-{uuid.uuid4().hex[:24]}", "type": "function",
                                      "function": {"name": "bash", "arguments": arguments}}]
        message["reasoning_content"] = None
        want_ids = bool(body.get("return_token_ids"))
        logprobs = None
        if body.get("logprobs"):
            temperature = float(body.get("temperature") if body.get("temperature") is not None else 1.0)
            top = int(body.get("top_logprobs") or 0)
            logprobs = {"content": [_logprob_entry(t, i, temperature, top) for i, t in enumerate(ids)]}
        token_ids = ids.tolist()
        prompt_ids: Any = _np.frombuffer(prompt, dtype=_np.uint16) if _np is not None else prompt.tolist()
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or MODEL,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish,
                         "stop_reason": None, "token_ids": token_ids if want_ids else None}],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(token_ids),
                      "completion_tokens": len(token_ids), "prompt_tokens_details": None},
            "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids if want_ids else None,
            "kv_transfer_params": None,
        }

    # -- ASGI ----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                event = await receive()
                if event["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif event["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        if method == "GET" and path in ("/health", "/healthz"):
            await _respond(send, 200, b'{"status":"ok"}')
        elif method == "GET" and path == "/version":
            await _respond(send, 200, orjson.dumps({"version": ENGINE_VERSION}))
        elif method == "GET" and path == "/v1/models":
            await _respond(send, 200, orjson.dumps({"object": "list", "data": [
                {"id": MODEL, "object": "model", "created": 0, "owned_by": "benchmark", "max_model_len": 1 << 20}]}))
        elif method == "POST" and path == "/tokenize":
            body = await _json_body(receive, send)
            if body is not None:
                ids = render(body.get("messages") or [], bool(body.get("add_generation_prompt", True)))
                await _respond(send, 200, orjson.dumps({"count": len(ids), "max_model_len": 1 << 20,
                                                        "tokens": ids.tolist()}))
        elif method == "POST" and path == "/v1/chat/completions":
            body = await _json_body(receive, send)
            if body is None:
                return
            if not isinstance(body.get("messages"), list) or not body["messages"]:
                await _error(send, 400, "'messages' must be a non-empty array")
                return
            reply = self.completion(body)
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                await _respond(send, 200, sse_body(reply, include_usage), b"text/event-stream")
            else:
                await _respond(send, 200, dumps(reply))
        else:
            await _error(send, 404, f"no route {method} {path}")


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def sse_body(reply: dict[str, Any], include_usage: bool) -> bytes:
    """A compact vLLM-style stream: role (+prompt ids), tool-call head, arguments (+ids), finish."""
    base = {k: reply[k] for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    choice = reply["choices"][0]
    message = choice["message"]

    def frame(delta: dict[str, Any], **extra: Any) -> bytes:
        c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **extra}
        top = {**base, "choices": [c]}
        if "prompt_token_ids" in extra:
            top["prompt_token_ids"] = c.pop("prompt_token_ids")
        return b"data: " + dumps(top) + b"\n\n"

    parts = [frame({"role": "assistant", "content": ""}, prompt_token_ids=reply["prompt_token_ids"])]
    if message.get("content"):
        parts.append(frame({"content": message["content"]}, token_ids=choice["token_ids"],
                           logprobs=choice["logprobs"]))
    for i, call in enumerate(message.get("tool_calls") or []):
        head = {"index": i, "id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""}}
        parts.append(frame({"tool_calls": [head]}))
        parts.append(frame({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]},
                           token_ids=choice["token_ids"], logprobs=choice["logprobs"]))
    parts.append(frame({}, finish_reason=choice["finish_reason"]))
    if include_usage:
        parts.append(b"data: " + orjson.dumps({**base, "choices": [], "usage": reply["usage"]}) + b"\n\n")
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


async def _read(receive: Receive) -> bytes:
    chunks = []
    while True:
        event = await receive()
        chunks.append(event.get("body", b""))
        if not event.get("more_body"):
            return b"".join(chunks)


async def _json_body(receive: Receive, send: Send) -> dict[str, Any] | None:
    try:
        body = orjson.loads(await _read(receive))
    except orjson.JSONDecodeError as exc:
        await _error(send, 400, f"invalid JSON: {exc}")
        return None
    if not isinstance(body, dict):
        await _error(send, 400, "body must be a JSON object")
        return None
    return body


async def _respond(send: Send, status: int, body: bytes, media: bytes = b"application/json") -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", media), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _error(send: Send, status: int, message: str) -> None:
    await _respond(send, status, orjson.dumps({"object": "error", "message": message, "type": "BadRequestError",
                                               "param": None, "code": status}))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", choices=("chain", "fixed"), default="chain")
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--completion-tokens", type=int, default=50)
    a = p.parse_args(argv)
    import uvicorn

    app = LeanEngine(EngineConfig(mode=a.mode, prompt_tokens=a.prompt_tokens, completion_tokens=a.completion_tokens))
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning", access_log=False, loop="uvloop",
                http="httptools", lifespan="on")


if __name__ == "__main__":
    main()
