"""The admin listener: session create and close on a port of their own, off the chat loop.

Why: every admin route on the main port runs on the event loop that serves the agents' calls, and
each ``await`` on its path waits a full pass of that loop -- at 64 busy sessions a create took
150-250 ms (docs/benchmarks.md, "Admin calls under load"), while a trainer starts a group of
rollouts at once. Here a second uvicorn server runs on its own thread and event loop
(``RecorderConfig.admin_port``), with the same routes' code and the same admin token:

- create runs here whole: the registry's maps take a lock (``SessionRegistry``), the journal write
  is under the store's append lock, and the indexer sends at once from a loop not its home one.
  Only a template probe (a stale probe, a trainer fingerprint to confirm) is the engine's business
  and hops to the chat loop (``RecorderContext.on_chat_loop``).
- close runs here when the session has no call in flight (a trainer's usual case: it closes
  rollouts that finished); a session with calls in flight hops to the chat loop, which cancels and
  waits for them (``SessionRegistry.close``).
- reading one session's summary and ``/admin/health`` are served too (reads of dicts and counters;
  the store's statistics use its per-thread SQLite reader); every other route stays on the main
  port only, which keeps all of them as they were.

The interpreter lock is shared: this thread runs when the chat thread lets go of it, at its next
blocking call or after ``sys.getswitchinterval()``; and it runs ``admin_nice`` steps ahead of the
recorder's other threads where the system allows (``raise_thread``) -- measured, not assumed
(docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from starlette.responses import Response

from openenv_harness.recorder.admin import health, sessions
from openenv_harness.recorder.admin.access import require_admin
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.edge.error_handlers import install_error_handlers
from openenv_harness.recorder.edge.request_limits import RequestLimits, check_scope
from openenv_harness.recorder.errors import error_response
from openenv_harness.recorder.serving import ThreadedServer

log = logging.getLogger(__name__)

#: (method, path, endpoint) served here: the same functions as the main port's routes
SERVED = (
    ("POST", "/sessions", sessions.create_session),
    ("GET", "/sessions/{session_id}", sessions.get_session),
    ("POST", "/sessions/{session_id}/close", sessions.close_session),
    ("GET", "/listener", health.listener),
    # what a rollout factory asks before each create (placement, the engine's context window): reads
    # of dicts, counters and the store's own per-thread SQLite reader
    ("GET", "/health", health.health),
)


async def _elsewhere(request: Request) -> Response:
    return error_response(404, f"the admin listener serves session create, read and close and health only: send "
                          f"{request.method} {request.url.path} to the recorder's main port", code="not_found")


class _HeadLimits:
    """The main port's bounds on a request's head (``request_limits.py``), before any route or auth."""

    def __init__(self, app: FastAPI, limits: RequestLimits) -> None:
        self.app, self.limits, self.state = app, limits, app.state

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            refusal = check_scope(scope, self.limits)
            if refusal is not None:
                await refusal.to_response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def admin_listener_app(ctx: RecorderContext, chat_port: int) -> FastAPI:
    """The listener's ASGI app. ``chat_port``: the main port, for the base URLs it hands out."""
    app = FastAPI(title="openenv-harness recorder admin listener", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ctx = ctx
    app.state.chat_port = chat_port
    router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])
    for method, path, endpoint in SERVED:
        router.add_api_route(path, endpoint, methods=[method],
                             status_code=201 if endpoint is sessions.create_session else 200)
    app.include_router(router)
    app.add_route("/{path:path}", _elsewhere, methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"])
    install_error_handlers(app, ctx.config)
    return app


def raise_thread(thread: threading.Thread | None, steps: int) -> int | None:
    """Move ``thread`` ``steps`` nice steps from this process's priority (Linux: each thread has its
    own); its new nice value, or None where the system does not allow it (raising needs
    ``CAP_SYS_NICE`` or ``RLIMIT_NICE``) -- the listener then runs at the recorder's priority.

    Why: on cores kept busy by the agents, the engine and the recorder's chat thread, a thread that
    wakes for an admin call waits for a CPU first; ahead of them it runs at once, then waits only for
    the interpreter. It sleeps in its event loop otherwise, so it takes nothing from the chat path.
    """
    tid = getattr(thread, "native_id", None)
    if not steps or tid is None or not hasattr(os, "setpriority") or sys.platform != "linux":
        return None
    target = max(-20, min(19, os.getpriority(os.PRIO_PROCESS, 0) + steps))
    try:
        os.setpriority(os.PRIO_PROCESS, tid, target)
    except OSError as exc:
        log.info("recorder: the admin listener runs at the recorder's priority (%s)", exc)
        return None
    return target


class AdminListener:
    """The listener's server on its own daemon thread (``serving.ThreadedServer``), bound next to the
    main port; started by the recorder's lifespan (``RecorderContext.start_admin_listener``) and
    stopped by it."""

    def __init__(self, ctx: RecorderContext, *, host: str, port: int, chat_port: int) -> None:
        self.host = host
        self._nice = ctx.config.admin_nice
        #: the thread's nice value once started (None: left at the recorder's)
        self.nice: int | None = None
        app = _HeadLimits(admin_listener_app(ctx, chat_port), RequestLimits.of(ctx.config))
        self._server: Any = ThreadedServer(app, host=host, port=port or None, http="httptools")

    @property
    def port(self) -> int:
        return int(self._server.port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> AdminListener:
        self._server.start()
        self.nice = raise_thread(self._server._thread, self._nice)
        return self

    def stop(self) -> None:
        self._server.stop()
