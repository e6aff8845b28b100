"""The recorder's error shapes for FastAPI's own failures, on every listener that serves its routes.

One place for them: the main port's app and the admin listener's (``admin_listener.py``) answer a
401, a 404, a 422 or a store that cannot take writes in the same OpenAI-style error body.
"""

from __future__ import annotations

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import Response

from openenv_harness.recorder.context import RecorderConfig
from openenv_harness.recorder.errors import error_response
from openenv_harness.recorder.store.indexer import IndexerFailed


def install_error_handlers(app: FastAPI, config: RecorderConfig) -> None:
    """Register the recorder's handlers on ``app``."""

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = "authentication_error" if exc.status_code == 401 else "invalid_request_error"
        return error_response(exc.status_code, str(exc.detail), type=kind)

    @app.exception_handler(404)
    async def not_found(request: Request, exc: Exception) -> Response:
        detail = getattr(exc, "detail", None)
        if isinstance(detail, str) and detail != "Not Found":  # a route's own 404 ("no session ...")
            return error_response(404, detail, code="not_found")
        return error_response(404, f"no route {request.method} {request.url.path}", code="not_found")

    @app.exception_handler(IndexerFailed)
    async def store_failed(request: Request, exc: IndexerFailed) -> Response:
        # a control-plane write (a session created or closed) while the store cannot take it
        return error_response(503, f"the record store cannot accept writes ({exc}); retry shortly",
                              type="server_error", code="store_unavailable",
                              headers={"retry-after": str(config.retry_after_s)})

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        parts = []
        for err in exc.errors()[:5]:
            where = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
            parts.append(f"{where}: {err.get('msg')}" if where else str(err.get("msg")))
        return error_response(422, "invalid request: " + "; ".join(parts), code="validation_error")

    @app.exception_handler(405)
    async def not_allowed(request: Request, exc: Exception) -> Response:
        return error_response(405, f"method {request.method} not allowed on {request.url.path}", code="method_not_allowed")
