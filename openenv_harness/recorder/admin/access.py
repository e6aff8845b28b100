"""Who may use the control plane: the admin token on any route, a viewer login's cookie on reads
only; and the small helpers every admin route shares."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, HTTPException, Request
from starlette.responses import Response

from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.session.live import LiveSession

router = APIRouter()


def context_of(request: Request) -> RecorderContext:
    ctx: RecorderContext = request.app.state.ctx
    return ctx


#: The trace viewer's login (``auth.ViewerLogins``, never the admin token) is this HttpOnly,
#: SameSite=Strict cookie.
ADMIN_COOKIE = "oeh_admin"
_READ_METHODS = frozenset({"GET", "HEAD"})


def admin_authorized(request: Request) -> bool:
    """The admin token as a bearer header on any route, or a viewer login's cookie on reads only:
    a browser never holds a credential that can change state (the viewer only reads)."""
    ctx = context_of(request)
    if ctx.admin_auth.check(request.headers):
        return True
    if request.method not in _READ_METHODS:
        return False
    return ctx.viewer_logins.valid(request.cookies.get(ADMIN_COOKIE))


async def require_admin(request: Request) -> RecorderContext:
    """Every control-plane route's guard. A coroutine on purpose: FastAPI runs a plain function
    dependency in its thread pool, a thread hand-off per admin request for a few microseconds of work."""
    ctx = context_of(request)
    if not admin_authorized(request):
        raise HTTPException(status_code=401, detail="admin token required (Authorization: Bearer <admin token>)")
    return ctx


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def session_or_404(ctx: RecorderContext, session_id: str) -> LiveSession:
    session = ctx.sessions.get(session_id)
    if session is None:
        raise HTTPException(status_code=404, detail=f"no session {session_id!r}")
    return session


@router.post("/viewer/codes", status_code=201)
async def new_viewer_code(request: Request) -> Response:
    """A one-time code for the trace viewer: ``/viewer/login?code=...`` logs a browser in once, within
    ``code_s``, without the admin token ever being in a URL (``auth.ViewerLogins``). Needs the token
    itself: a viewer login's cookie only reads."""
    ctx = context_of(request)
    code = ctx.viewer_logins.new_code()
    return json_response({"code": code, "login_path": f"/viewer/login?code={code}",
                  "expires_in_s": ctx.viewer_logins.code_s}, status=201)
