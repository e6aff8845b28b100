"""A scripted OpenAI-compatible engine for the preset tests -- a test double, not a model.

It stands in for vLLM (and the recorder in front of it) so the real CLIs can be driven through a
whole tool episode on a machine without a GPU. It speaks vLLM's streaming shape: a role chunk, tool
call deltas (index, id, type and name first, then the arguments in pieces), a finish chunk with a
real ``finish_reason``, a usage chunk when ``stream_options.include_usage`` asked for one, then
``data: [DONE]``. The script: a request that offers tools and has no tool result after its last
user message gets a ``bash`` tool call; anything else gets the final text.

Every request is kept (path, headers, body) so tests can assert what the agent really sent.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass(frozen=True)
class SeenRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def _needs_tool_call(body: dict[str, Any]) -> bool:
    if not body.get("tools"):
        return False
    messages = body.get("messages") or []
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    return not any(m.get("role") == "tool" for m in messages[last_user + 1 :])


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


class StubEngine:
    """Loopback server on a free port; use as a context manager."""

    def __init__(
        self,
        *,
        tool_command: str,
        final_text: str,
        api_key: str | None = None,
        model: str = "stub-model",
    ) -> None:
        self.tool_command = tool_command
        self.final_text = final_text
        self.api_key = api_key
        self.model = model
        self.requests: list[SeenRequest] = []
        self._counter = 0
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        app = Starlette(routes=[Route("/{path:path}", self._handle, methods=["GET", "POST"])])
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "StubEngine":
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("stub engine did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def chat_requests(self) -> list[SeenRequest]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    async def _handle(self, request: Request) -> Response:
        raw = await request.body()
        body = json.loads(raw) if raw else {}
        with self._lock:
            self.requests.append(SeenRequest(request.url.path, dict(request.headers), body))
            self._counter += 1
            call = self._counter
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            error = {"error": {"message": "invalid api key", "type": "authentication_error", "code": 401}}
            return JSONResponse(error, status_code=401)
        if not request.url.path.endswith("/chat/completions"):
            return JSONResponse({"error": {"message": "not found", "code": 404}}, status_code=404)
        tool = _needs_tool_call(body)
        call_id = f"call_stub{call:03d}"
        # Calls without tools are the agent's own bookkeeping (a title); they get a title back.
        text = self.final_text if body.get("tools") else "Stub Title"
        if not body.get("stream"):
            return JSONResponse(self._completion(call, call_id, tool, text))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        stream = self._stream(call, call_id, tool, text, include_usage)
        return StreamingResponse(stream, media_type="text/event-stream")

    def _completion(self, call: int, call_id: str, tool: bool, text: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": None if tool else text}
        if tool:
            arguments = json.dumps({"command": self.tool_command})
            message["tool_calls"] = [
                {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": arguments}}
            ]
        return {
            "id": f"chatcmpl-stub{call}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool else "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
        }

    async def _stream(
        self, call: int, call_id: str, tool: bool, text: str, include_usage: bool
    ) -> AsyncIterator[bytes]:
        base = {
            "id": f"chatcmpl-stub{call}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return _sse({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

        yield chunk({"role": "assistant", "content": ""})
        if tool:
            arguments = json.dumps({"command": self.tool_command})
            head = {"index": 0, "id": call_id, "type": "function", "function": {"name": "bash", "arguments": ""}}
            yield chunk({"tool_calls": [head]})
            third = max(1, len(arguments) // 3)
            for piece in (arguments[:third], arguments[third : 2 * third], arguments[2 * third :]):
                yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            yield chunk({}, "tool_calls")
        else:
            half = len(text) // 2
            yield chunk({"content": text[:half]})
            yield chunk({"content": text[half:]})
            yield chunk({}, "stop")
        if include_usage:
            usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
            yield _sse({**base, "choices": [], "usage": usage})
        yield _sse("[DONE]")
