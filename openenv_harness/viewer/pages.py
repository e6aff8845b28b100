"""The viewer's page routes: login, logout, the page itself and its script and stylesheet.

Why a cookie: a browser cannot attach an ``Authorization`` header to a page load. Logging in -- the
admin token typed into the form on the 401 page (``POST /viewer/login``), or a one-time code in a
link (``GET /viewer/login?code=...``, from ``POST /admin/viewer/codes``; ``openenv-harness serve``
prints one) -- sets an HttpOnly, SameSite=Strict cookie naming a login (``auth.ViewerLogins``) that
the recorder accepts on read-only admin routes. The admin token itself is never accepted in a URL
(history, proxy logs, screenshots) and never handed to the browser. Everything else here answers
401 without a login. The page is plain HTML, CSS and JavaScript shipped with the
package and pinned by a Content-Security-Policy to this origin: it works offline and cannot load
or send anything elsewhere.
"""

from __future__ import annotations

import html
from importlib import resources
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from starlette.responses import RedirectResponse, Response

from openenv_harness.recorder.admin.access import ADMIN_COOKIE, admin_authorized
from openenv_harness.recorder.context import RecorderContext

VIEWER_PATH = "/viewer/"
#: Asset name -> media type; nothing else is served.
_JS = "text/javascript; charset=utf-8"
ASSETS: dict[str, str] = {
    "viewer.js": _JS,
    "dom.js": _JS,
    "calls.js": _JS,
    "graph.js": _JS,
    "tokens.js": _JS,
    "viewer.css": "text/css; charset=utf-8",
}
MAX_LOGIN_BODY = 4096

SECURITY_HEADERS: dict[str, str] = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
    "x-frame-options": "DENY",
}

pages_router = APIRouter()


def _static(name: str) -> bytes:
    return resources.files("openenv_harness.viewer").joinpath("static", name).read_bytes()


def _page(body: bytes | str, status: int = 200, media_type: str = "text/html; charset=utf-8") -> Response:
    return Response(body, status_code=status, media_type=media_type, headers=dict(SECURITY_HEADERS))


def _login_page(message: str, next_path: str = VIEWER_PATH, status: int = 401) -> Response:
    """401 with a login form: says what is needed, reveals nothing else."""
    text = _static("login.html").decode("utf-8")
    text = text.replace("{{message}}", html.escape(message)).replace("{{next}}", html.escape(next_path, quote=True))
    return _page(text, status=status)


def safe_next(next_path: str | None) -> str:
    """Where to go after login: only a path inside the viewer (no open redirect)."""
    if not next_path or not next_path.startswith(VIEWER_PATH) or "\\" in next_path or "//" in next_path:
        return VIEWER_PATH
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in next_path):
        return VIEWER_PATH
    return next_path


def _token_ok(request: Request, token: str | None) -> bool:
    ctx: RecorderContext = request.app.state.ctx
    return bool(token) and ctx.admin_auth.check({"authorization": f"Bearer {token}"})


def _logged_in(request: Request, next_path: str) -> Response:
    """A new login in the viewer cookie, then ``next`` (a viewer path)."""
    ctx: RecorderContext = request.app.state.ctx
    response = RedirectResponse(safe_next(next_path), status_code=303, headers=dict(SECURITY_HEADERS))
    response.set_cookie(
        ADMIN_COOKIE, ctx.viewer_logins.new_login(), httponly=True, samesite="strict", path="/",
        secure=request.url.scheme == "https", max_age=int(ctx.viewer_logins.login_s),
    )
    return response


@pages_router.get("/viewer/login")
async def login(request: Request, code: str | None = None, next: str | None = None) -> Response:
    """The login form; or, with a one-time ``code``, the login itself. A ``token`` here is refused."""
    ctx: RecorderContext = request.app.state.ctx
    if "token" in request.query_params:
        return _login_page("The admin token is not accepted in a URL: it would stay in the browser's history "
                           "and in proxy logs. Type it here instead (and consider changing it).", safe_next(next),
                           status=400)
    if code is None:
        return _login_page("Log in with the recorder's admin token.", safe_next(next))
    if not ctx.viewer_logins.redeem(code):
        return _login_page("That login link has been used or has expired: log in with the admin token, or ask "
                           "for a new link.", safe_next(next))
    return _logged_in(request, next or VIEWER_PATH)


@pages_router.post("/viewer/login")
async def login_form(request: Request) -> Response:
    """The 401 page's form (urlencoded ``token`` and ``next``): keeps the token out of the URL."""
    body = await request.body()
    if len(body) > MAX_LOGIN_BODY:
        return _page(b"login body too large", status=413, media_type="text/plain; charset=utf-8")
    fields = parse_qs(body.decode("utf-8", "replace"), max_num_fields=8)
    token = (fields.get("token") or [""])[0].strip()
    next_path = safe_next((fields.get("next") or [VIEWER_PATH])[0])
    if not _token_ok(request, token):
        return _login_page("That is not this recorder's admin token.", next_path)
    return _logged_in(request, next_path)


@pages_router.get("/viewer/logout")
async def logout(request: Request) -> Response:
    """End the login and forget the cookie. Needs no token: it only ends the browser's own credential."""
    ctx: RecorderContext = request.app.state.ctx
    ctx.viewer_logins.end(request.cookies.get(ADMIN_COOKIE))
    response = RedirectResponse(VIEWER_PATH, status_code=303, headers=dict(SECURITY_HEADERS))
    response.delete_cookie(ADMIN_COOKIE, path="/", httponly=True, samesite="strict")
    return response


@pages_router.get("/viewer")
async def viewer_root(request: Request) -> Response:
    if not admin_authorized(request):
        return _login_page("Log in with the recorder's admin token.")
    return RedirectResponse(VIEWER_PATH, status_code=307, headers=dict(SECURITY_HEADERS))


@pages_router.get(VIEWER_PATH)
async def viewer_page(request: Request) -> Response:
    if not admin_authorized(request):
        return _login_page("Log in with the recorder's admin token.")
    return _page(_static("index.html"))


@pages_router.get("/viewer/static/{name}")
async def viewer_asset(name: str, request: Request) -> Response:
    if not admin_authorized(request):
        return _page(b"admin token required", status=401, media_type="text/plain; charset=utf-8")
    media_type = ASSETS.get(name)
    if media_type is None:
        return _page(f"no viewer asset {name!r}".encode(), status=404, media_type="text/plain; charset=utf-8")
    return _page(_static(name), media_type=media_type)
