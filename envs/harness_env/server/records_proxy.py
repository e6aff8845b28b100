"""The recorder's admin API, reachable through the environment server's own port.

When the recorder runs inside this server it listens on loopback, which a trainer talking to a
Space cannot reach -- a Space exposes one port. So ``/recorder/admin/...`` forwards to the
recorder's ``/admin/...`` unchanged: the trainer reads records, waits on sessions, and fences the
engine for a weight sync exactly as against its own recorder. The recorder still checks the admin
token on every call; this route adds no access of its own. With an external recorder there is
nothing to forward (the trainer already reaches it) and the route answers 404.
"""

from __future__ import annotations

import httpx
from fastapi import APIRouter, HTTPException, Request
from starlette.responses import Response

from .backend import PROXY_PREFIX, HarnessBackend

#: Headers worth forwarding: the admin token and the body's type. Nothing else reaches the recorder.
_FORWARDED_REQUEST_HEADERS = ("authorization", "content-type", "accept")
#: The recorder's long-poll (``/wait``) may hold a request for up to an hour.
_TIMEOUT = httpx.Timeout(connect=10.0, read=3700.0, write=60.0, pool=10.0)


def recorder_proxy_router(backend: HarnessBackend) -> APIRouter:
    router = APIRouter(prefix=PROXY_PREFIX, tags=["Recorder"])

    async def forward(path: str, request: Request) -> Response:
        if not backend.owns_recorder:
            raise HTTPException(status_code=404, detail="this server uses an external recorder; read records there")
        if any(part in ("", ".", "..") for part in path.split("/")):
            raise HTTPException(status_code=400, detail=f"invalid recorder path {path!r}")
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED_REQUEST_HEADERS}
        async with httpx.AsyncClient(base_url=backend.recorder_url, timeout=_TIMEOUT) as http:
            try:
                upstream = await http.request(request.method, f"/admin/{path}", params=request.query_params,
                                              content=await request.body(), headers=headers)
            except httpx.HTTPError as exc:
                raise HTTPException(status_code=502, detail=f"recorder unreachable: {exc}") from None
        return Response(upstream.content, status_code=upstream.status_code,
                        media_type=upstream.headers.get("content-type"))

    for method in ("GET", "POST"):
        router.add_api_route("/admin/{path:path}", forward, methods=[method],
                             operation_id=f"recorder_admin_{method.lower()}",
                             summary=f"{method} on the in-process recorder's admin API (admin token required)")
    return router
