"""What a call's steps may use of the recorder, and nothing more.

Why a narrow interface: a step that could reach the whole recorder (``context.py``) could also
reach the session registry, the admin listener or the other sessions, and a reader of one step would
have to check that it does not. The steps read the settings, append to and read from the store, pass
the weight-sync fence, ask the session's engine and what is known of it, and count metrics; a step
that ends a session says so on the flow (``Flow.stop``), and the pipeline stops it. The recorder's
context provides these structurally; a step test provides them from memory (``testing/tflow.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from openenv_harness.recorder.config import RecorderConfig
    from openenv_harness.recorder.engine_knowledge.engine_watch import EngineWatch
    from openenv_harness.recorder.fence import Fence
    from openenv_harness.recorder.metrics import RecorderMetrics
    from openenv_harness.recorder.prompt_modes.engine_facts import EngineFactsTable
    from openenv_harness.recorder.session.registry import SessionRegistry
    from openenv_harness.recorder.store.base import RecordStore
    from openenv_harness.recorder.upstream.base import Upstream


class CallServices(Protocol):
    """The recorder as one call's steps see it."""

    @property
    def config(self) -> RecorderConfig: ...

    @property
    def store(self) -> RecordStore: ...

    @property
    def fence(self) -> Fence: ...

    @property
    def metrics(self) -> RecorderMetrics: ...

    @property
    def engine_watch(self) -> EngineWatch:
        """What the default engine said of itself (``info``: version, sampling defaults), its template
        and the template's certification, as last probed."""

    @property
    def engine_facts(self) -> EngineFactsTable:
        """What the incremental mode learned about each engine by asking it."""

    def upstream_for(self, name: str | None) -> Upstream | None: ...


class CallEntry(CallServices, Protocol):
    """What the pipeline needs besides: the sessions, to find the call's and to apply a stop a step set."""

    @property
    def sessions(self) -> SessionRegistry: ...
