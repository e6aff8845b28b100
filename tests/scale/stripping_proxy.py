"""A test double of a router that drops token evidence (older sglang-router versions stripped
``prompt_token_ids``): it forwards every request to a real router and deletes the named keys from
JSON replies, at the top level and in each choice."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def stripping_proxy(upstream: str, drop: tuple[str, ...]) -> Starlette:
    client = httpx.AsyncClient(base_url=upstream, timeout=60.0)

    def strip(payload: Any) -> Any:
        if isinstance(payload, dict):
            for key in drop:
                payload.pop(key, None)
            for choice in payload.get("choices") or []:
                if isinstance(choice, dict):
                    for key in drop:
                        choice.pop(key, None)
        return payload

    async def forward(request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        reply = await client.request(request.method, request.url.path, params=request.query_params,
                                     content=await request.body(), headers=headers)
        body = reply.content
        if reply.headers.get("content-type", "").startswith("application/json"):
            body = orjson.dumps(strip(orjson.loads(body)))
        return Response(body, status_code=reply.status_code, media_type=reply.headers.get("content-type"))

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])
