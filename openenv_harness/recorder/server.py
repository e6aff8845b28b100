"""Run a recorder: in a background thread (trainers, tests, white-box runs) or as a process.

The composition root: it builds the recorder's app, binds the main listener, and gives the recorder
what starts the admin listener next to it (``admin_listener.py``). uvicorn with uvloop and httptools
when available (they are part of ``uvicorn[standard]``): the pure-Python HTTP stack is where a
proxy's per-call time goes. Its httptools protocol is replaced by ``edge/agent_protocol.AgentCallProtocol``,
which answers agent chat calls without an ASGI cycle and leaves every other request to uvicorn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import uvicorn

from openenv_harness.recorder.admin_listener import AdminListener
from openenv_harness.recorder.app import create_recorder_app
from openenv_harness.recorder.context import RecorderConfig, RecorderContext
from openenv_harness.recorder.edge.agent_protocol import agent_protocol_class
from openenv_harness.recorder.heap import HeapTrimmer, freeze_startup_heap
from openenv_harness.recorder.serving import ThreadedServer, connection_settings
from openenv_harness.recorder.upstream.base import Upstream

log = logging.getLogger(__name__)


def bind(ctx: RecorderContext, host: str, port: int) -> None:
    """The recorder listens on ``host:port``; its admin listener, when configured, next to it."""
    ctx.listen = (host, port)

    def start_admin_listener() -> AdminListener:
        listener = AdminListener(ctx, host=host, port=ctx.config.admin_port or 0, chat_port=port).start()
        log.info("recorder: admin listener on %s (session create and close)", listener.url)
        return listener

    ctx.start_admin_listener = start_admin_listener


class RecorderServer(ThreadedServer):
    """A recorder on a background thread. ``.ctx`` is its live context (sessions, fence, store)."""

    def __init__(
        self,
        config: RecorderConfig,
        *,
        upstreams: dict[str, Upstream] | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
    ) -> None:
        app = create_recorder_app(config, upstreams=upstreams)
        super().__init__(app, host=host, port=port)
        self.recorder_context: RecorderContext = app.recorder_context
        bind(self.recorder_context, host, self.port)
        self.config = config

    @property
    def ctx(self) -> RecorderContext:
        return self.recorder_context

    @property
    def admin_token(self) -> str:
        return self.ctx.admin_token

    @property
    def admin_url(self) -> str | None:
        """The admin listener's URL (``RecorderConfig.admin_port``), None without one."""
        listener = self.ctx.admin_listener
        return None if listener is None else listener.url


def serve(config: RecorderConfig, *, host: str = "127.0.0.1", port: int = 8765, log_level: str = "info",
          announce: Callable[[RecorderContext], None] | None = None) -> None:
    """Run a recorder in the foreground (the ``openenv-harness serve`` command). ``announce`` is
    called with the new recorder's context before it starts serving (the command prints a one-time
    viewer login link from it)."""
    app = create_recorder_app(config)
    bind(app.state.ctx, host, port)
    # the recorder's own lines (the template certification at start, engine changes) beside uvicorn's
    ours = logging.getLogger("openenv_harness")
    if not ours.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        ours.addHandler(handler)
        ours.setLevel(log_level.upper())
    if announce is not None:
        announce(app.state.ctx)
    freeze_startup_heap()
    trimmer = HeapTrimmer().start()
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False,
                    http=agent_protocol_class() or "auto", **connection_settings(app))
    finally:
        trimmer.stop()
