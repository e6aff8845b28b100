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
from openenv_harness.recorder.dialects.base import decode_object
from openenv_harness.recorder.dialects.count_tokens import prompt_length
from openenv_harness.recorder.dialects.gemini import COUNT, GeminiTarget, google_error
from openenv_harness.recorder.edge.request_body import read_body
from openenv_harness.recorder.errors import AgentError


async def count_tokens(request: Request, target: GeminiTarget) -> Response:
    ctx: RecorderContext = request.app.state.ctx
    headers = {k.lower(): v for k, v in request.headers.items()}
    assert target.method == COUNT
    try:
        session = authenticate(ctx.sessions, target.session_id, headers)
        raw = await read_body(request, ctx.config.max_body_bytes)
        body = decode_object(raw)
        chat, _ = gemini_request.to_chat(body, session.dialect_memory, model=target.model, stream=False,
                                         count_only=True)
    except AgentError as exc:
        return google_error(exc.status, exc.message, exc.headers)
    count = await prompt_length(ctx, session, chat, google_error, "countTokens")
    if isinstance(count, Response):
        return count
    return Response(orjson.dumps({"totalTokens": count}), media_type="application/json")
