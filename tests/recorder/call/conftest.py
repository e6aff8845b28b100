"""Step tests: a recorder's parts in memory, a session in its store, a flow built by hand.

Each step is a function of the flow (``recorder/call/``): a test builds the flow a step expects and
runs that step alone, on the in-memory store (``testing/tflow.py``) and, where a step asks the
engine over HTTP, the reference engine over loopback (``engine_ctx``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator

import orjson
import pytest

from openenv_harness.recorder.app import create_recorder_app
from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.context import RecorderConfig, RecorderContext
from openenv_harness.recorder.dialects.base import Dialect
from openenv_harness.recorder.dialects.routes import CHAT
from openenv_harness.recorder.session.live import LiveSession
from openenv_harness.testing.engine import EngineServer

from step_flows import MakeFlow, build_context

@pytest.fixture
def ctx() -> RecorderContext:
    return build_context()


@pytest.fixture
def make_flow() -> MakeFlow:
    def make(ctx: RecorderContext, session: LiveSession, body: Any, *, dialect: Dialect = CHAT,
             headers: dict[str, str] | None = None) -> Flow:
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        return Flow(ctx=ctx, session=session, headers=headers or {}, dialect=dialect, raw=raw)
    return make


@pytest.fixture
async def engine_ctx(tmp_path: Path, engine: EngineServer) -> AsyncIterator[RecorderContext]:
    """A recorder's context on the reference engine (the tier's module-scoped ``engine``)."""
    context = create_recorder_app(RecorderConfig(store_path=str(tmp_path / "records.db"), store_indexer="thread",
                                                 probe_template=False, engine_url=engine.url,
                                                 pause_wait_s=0)).recorder_context
    context.store.open()
    upstream = context.upstream_for(None)
    assert upstream is not None
    await upstream.start()
    try:
        yield context
    finally:
        await upstream.aclose()
        context.store.close()
