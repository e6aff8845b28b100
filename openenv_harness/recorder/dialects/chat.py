"""Chat Completions as a dialect: the identity one.

Why a dialect at all: the steps between the two ends are the same for every agent, and an agent
speaking Chat Completions differs from the others only in what its request and reply look like --
here, exactly what the engine takes and answers. So chat enters as its own bytes (decoded once,
with the chat route's own refusals), leaves as the recorded completion (JSON, or the OpenAI event
stream synthesized from it, ``sse.py``), and its errors keep the OpenAI error shape. Its replies
hand the agent the engine's parsed tool-call arguments, as an OpenAI-compatible server would, so it
records no sampled argument text.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson
from starlette.responses import Response

from openenv_harness.recorder.dialects.base import Dialect, Entered
from openenv_harness.recorder.dialects.dialect_call import DialectCall
from openenv_harness.recorder.dialects.memory import ReplayMemory
from openenv_harness.recorder.edge.request_body import not_json
from openenv_harness.recorder.edge.sse import synthesize_sse
from openenv_harness.recorder.errors import AgentError


class ChatDialect(Dialect):
    name: ClassVar[str] = "chat"
    path_suffix: ClassVar[str] = "/v1/chat/completions"
    session_header: ClassVar[str] = "x-session-id"
    records_sampled_arguments: ClassVar[bool] = False

    def enter(self, raw: bytes, memory: ReplayMemory) -> Entered:
        """The agent's body as it is (the edge bounded its size: ``request_body.receive_body``), decoded once."""
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise not_json(exc, raw) from None
        if not isinstance(body, dict):
            raise AgentError(400, "request body must be a JSON object", code="invalid_body")
        return Entered(body, raw, DialectCall())

    def render(self, reply: dict[str, Any], call: DialectCall, memory: ReplayMemory, *, stream: bool,
               include_usage: bool) -> Response:
        if stream:
            return Response(synthesize_sse(reply, include_usage=include_usage), media_type="text/event-stream",
                            headers={"cache-control": "no-cache"})
        return Response(orjson.dumps(reply), media_type="application/json")

    def to_chat(self, body: dict[str, Any], memory: ReplayMemory) -> tuple[dict[str, Any], DialectCall]:
        return body, DialectCall()

    def message(self, reply: dict[str, Any], call: DialectCall, memory: ReplayMemory) -> dict[str, Any]:
        return reply

    def stream(self, reply: dict[str, Any], call: DialectCall, memory: ReplayMemory) -> bytes:
        return synthesize_sse(reply, include_usage=False)

    def remember(self, record: dict[str, Any], memory: ReplayMemory) -> None:
        """A chat reply hands out nothing to remember."""

    def error(self, exc: AgentError) -> Response:
        return exc.to_response()

    def stream_error(self, response: Response) -> bytes:
        """An error as a Chat Completions stream chunk: OpenAI's clients raise on a chunk with ``error``."""
        return b"data: " + _error_payload(response) + b"\n\n"


def _error_payload(response: Response) -> bytes:
    body = bytes(response.body)
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and "error" in parsed:
        return body
    text = body.decode("utf-8", "replace") or f"HTTP {response.status_code}"
    return orjson.dumps({"error": {"message": text, "type": "server_error", "param": None, "code": None}})


CHAT = ChatDialect()
