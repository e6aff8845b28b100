"""``POST .../models/<model>:countTokens``: Google's token count, answered by the engine's tokenizer.

Why from the engine: only the engine knows what its template makes of the contents. The body is
translated exactly as a ``generateContent`` call would be (same ``to_chat``, same replay memory) and
sent to the engine's ``/tokenize`` in its chat form. Nothing is sampled, recorded or charged to a
budget: it is not a policy sample. Gemini CLI asks only for media parts and falls back to its own
estimate on an error, so an engine without ``/tokenize`` answers 501 in Google's error shape.
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import Response

from openenv_harness.recorder.call.authenticate import authenticate
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.dialects import gemini_request
from openenv_harness.recorder.dialects.base import decode_object, memory_for
from openenv_harness.recorder.dialects.gemini import COUNT, GeminiTarget, google_error
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.relay_errors import relay_upstream_error
from openenv_harness.recorder.request_body import read_body
from openenv_harness.recorder.upstream.base import UpstreamFailure
from openenv_harness.recorder.upstream.routes import TOKENIZE


async def count_tokens(request: Request, target: GeminiTarget) -> Response:
    ctx: RecorderContext = request.app.state.ctx
    headers = {k.lower(): v for k, v in request.headers.items()}
    assert target.method == COUNT
    try:
        session = authenticate(ctx, target.session_id, headers)
        raw = await read_body(request, ctx.config.max_body_bytes)
        body = decode_object(raw, ctx.config.max_body_bytes)
        chat, _ = gemini_request.to_chat(body, memory_for(session), model=target.model, stream=False,
                                         count_only=True)
    except AgentError as exc:
        return google_error(exc.status, exc.message, exc.headers)
    upstream = ctx.upstream_for(session.spec.upstream)
    if upstream is None:
        return google_error(503, "no engine is configured for this session",
                            {"retry-after": str(ctx.config.retry_after_s)})
    tokenize = {"model": ctx.fence.served_model or chat.get("model"), "messages": chat["messages"],
                "add_generation_prompt": True}
    if chat.get("tools"):
        tokenize["tools"] = chat["tools"]
    try:
        reply = await upstream.request("POST", TOKENIZE, json=tokenize)
    except UpstreamFailure as exc:
        if exc.kind == "protocol":
            return google_error(501, f"countTokens is not available on this engine: {exc.message}")
        return google_error(504 if exc.kind == "timeout" else 502, exc.message,
                            {"retry-after": str(ctx.config.retry_after_s)})
    count = reply.json.get("count") if reply.status == 200 and isinstance(reply.json, dict) else None
    if not isinstance(count, int):
        if reply.status == 200:
            return google_error(502, "the engine's /tokenize reply holds no 'count'")
        error = relay_upstream_error(reply)
        return google_error(error.status, error.message, error.headers)
    return Response(orjson.dumps({"totalTokens": count}), media_type="application/json")
