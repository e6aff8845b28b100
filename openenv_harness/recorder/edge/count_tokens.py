"""The token-count routes: Anthropic's ``POST /v1/messages/count_tokens`` and Google's
``POST .../models/<model>:countTokens``, answered by the engine's tokenizer.

Why here, beside the agent routes and not among the dialects: a count is an HTTP route that uses a
dialect's request translation, not a dialect -- it never enters the call's steps. Why from the engine
and never from a guess: Claude Code sizes its context (``/context``, tool search) from these counts,
and only the engine knows what its template makes of the messages. The body is translated exactly as
a call would be (same ``to_chat``, same replay memory) and sent to the engine's ``/tokenize`` in its
chat form, so the count is the length of the prompt a call with this body would have. Nothing is
sampled and nothing is recorded: it is not a policy sample (and no budget is charged). An engine
without ``/tokenize`` (the white-box ``ModelStep`` upstream) answers 501, which Claude Code reads as
"count some other way"; Gemini CLI asks only for media parts and falls back to its own estimate on an
error, so its 501 is in Google's error shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from openenv_harness.recorder.call.admit import authenticate
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.dialects import anthropic_request, gemini_request
from openenv_harness.recorder.dialects.anthropic import anthropic_error
from openenv_harness.recorder.dialects.base import decode_object
from openenv_harness.recorder.dialects.gemini import COUNT, GeminiTarget, google_error
from openenv_harness.recorder.dialects.memory import ReplayMemory
from openenv_harness.recorder.edge.request_body import read_body
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.relay_errors import relay_upstream_error
from openenv_harness.recorder.session.live import LiveSession
from openenv_harness.recorder.upstream.base import UpstreamFailure
from openenv_harness.recorder.upstream.routes import TOKENIZE


async def anthropic_count_tokens_route(request: Request) -> Response:
    def to_chat(body: dict[str, Any], memory: ReplayMemory) -> dict[str, Any]:
        return anthropic_request.to_chat(body, memory, count_only=True)[0]

    return await _count(request, request.path_params.get("session_id"), to_chat, anthropic_error, "count_tokens",
                        "input_tokens")


async def gemini_count_tokens_route(request: Request, target: GeminiTarget) -> Response:
    assert target.method == COUNT

    def to_chat(body: dict[str, Any], memory: ReplayMemory) -> dict[str, Any]:
        return gemini_request.to_chat(body, memory, model=target.model, stream=False, count_only=True)[0]

    return await _count(request, target.session_id, to_chat, google_error, "countTokens", "totalTokens")


async def _count(request: Request, session_id: str | None,
                 to_chat: Callable[[dict[str, Any], ReplayMemory], dict[str, Any]],
                 error: Callable[..., Response], route: str, field: str) -> Response:
    """One count: the agent's key, its body translated as the dialect's call would be, the engine's
    length of it -- every failure in the dialect's ``error`` shape; the count answered as ``field``."""
    ctx: RecorderContext = request.app.state.ctx
    headers = {k.lower(): v for k, v in request.headers.items()}
    try:
        session = authenticate(ctx.sessions, session_id, headers)
        chat = to_chat(decode_object(await read_body(request, ctx.config.max_body_bytes)), session.dialect_memory)
    except AgentError as exc:
        return error(exc.status, exc.message, exc.headers)
    count = await prompt_length(ctx, session, chat, error, route)
    if isinstance(count, Response):
        return count
    return Response(orjson.dumps({field: count}), media_type="application/json")


async def prompt_length(ctx: RecorderContext, session: LiveSession, chat: dict[str, Any],
                        error: Callable[..., Response], route: str) -> int | Response:
    """The length of the prompt ``chat`` would have, from the engine's ``/tokenize`` in its chat form;
    a failure is answered through the dialect's ``error`` (its shape, the status a client retries on)."""
    upstream = ctx.upstream_for(session.spec.upstream)
    if upstream is None:
        return error(503, "no engine is configured for this session", {"retry-after": str(ctx.config.retry_after_s)})
    tokenize = {"model": ctx.fence.served_model or chat.get("model"), "messages": chat["messages"],
                "add_generation_prompt": True}
    if chat.get("tools"):
        tokenize["tools"] = chat["tools"]
    try:
        reply = await upstream.request("POST", TOKENIZE, json=tokenize)
    except UpstreamFailure as exc:
        if exc.kind == "protocol":
            return error(501, f"{route} is not available on this engine: {exc.message}")
        return error(504 if exc.kind == "timeout" else 502, exc.message, {"retry-after": str(ctx.config.retry_after_s)})
    count = reply.json.get("count") if reply.status == 200 and isinstance(reply.json, dict) else None
    if isinstance(count, int):
        return count
    if reply.status == 200:
        return error(502, "the engine's /tokenize reply holds no 'count'")
    relayed = relay_upstream_error(reply)
    return error(relayed.status, relayed.message, relayed.headers)
