"""Everything one recorder instance owns, in one explicit object (no module-level globals or caches).

The ASGI app and the admin routes receive this context; a call's steps see only the part of it they
use (``call/services.py``), which it provides structurally. Tests build one per app.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from openenv_harness.recorder.auth import AdminAuth, ViewerLogins
from openenv_harness.recorder.config import RecorderConfig
from openenv_harness.recorder.engine_knowledge.engine_watch import EngineWatch
from openenv_harness.recorder.fence import Fence
from openenv_harness.recorder.metrics import RecorderMetrics
from openenv_harness.recorder.prompt_modes.engine_facts import EngineFactsTable
from openenv_harness.recorder.session.registry import SessionRegistry
from openenv_harness.recorder.store.base import RecordStore
from openenv_harness.recorder.upstream.base import Upstream
from openenv_harness.recorder.upstream.span_budget import SpanBudget

T = TypeVar("T")

__all__ = ["RecorderConfig", "RecorderContext", "SideListener"]


class SideListener(Protocol):
    """A listener running beside the main one (the admin listener, ``admin_listener.py``)."""

    @property
    def url(self) -> str: ...

    @property
    def port(self) -> int: ...

    def stop(self) -> None: ...


@dataclass
class RecorderContext:
    """The live parts of one recorder."""

    config: RecorderConfig
    store: RecordStore
    sessions: SessionRegistry
    fence: Fence
    upstreams: dict[str, Upstream]
    metrics: RecorderMetrics
    admin_token: str = field(repr=False)
    admin_auth: AdminAuth
    #: probes the default engine's template at start and again when it may have changed; what it
    #: learns is ``engine_info`` (its dict), which health, sessions and provenance read
    engine_watch: EngineWatch
    viewer_logins: ViewerLogins = field(default_factory=ViewerLogins)
    #: the engine replicas the fence pauses and resumes (``replicas.ReplicaFence``), when there are several
    replicas: Any = None
    #: one bound on the prompt spans every session's ``PromptIdsReader`` keeps (``span_budget.py``)
    span_budget: SpanBudget = field(default_factory=SpanBudget)
    #: what the incremental mode learned about each engine by asking it (``engine_facts.py``)
    engine_facts: EngineFactsTable = field(default_factory=EngineFactsTable)

    #: the main listener's (host, port), set by the server that runs it (``server.py``)
    listen: tuple[str, int] | None = None
    #: starts the admin listener (``RecorderConfig.admin_port``) once the store is open: given by the
    #: server that runs this recorder (``server.py``), which binds it next to the main port
    start_admin_listener: Callable[[], SideListener] | None = None
    #: the admin listener while it runs
    admin_listener: SideListener | None = None

    @property
    def engine_info(self) -> dict[str, Any]:
        return self.engine_watch.info

    def upstream_for(self, name: str | None) -> Upstream | None:
        return self.upstreams.get(name or "default")

    async def on_chat_loop(self, work: Awaitable[T]) -> T:
        """Await ``work`` on the chat loop: directly when already there, else handed over and waited
        for (the engine's connections and the template probe's lock belong to that loop)."""
        home = self.sessions.loop
        if home is None or home is asyncio.get_running_loop():
            return await work
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, home))  # type: ignore[arg-type]
