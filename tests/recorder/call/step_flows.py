"""What step tests build: a recorder's context without its server, a session in its store, a flow by hand.

Each step is a function of the flow (``recorder/call/``): a test builds the flow a step expects and
runs that step alone, against the real store on a temporary file and, where a step asks the engine,
the reference engine over loopback HTTP (fixtures: ``conftest.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from openenv_harness.recorder.app import create_recorder_app
from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.context import RecorderConfig, RecorderContext
from openenv_harness.recorder.live_session import LiveSession
from openenv_harness.recorder.session_spec import SessionSpec

MakeFlow = Callable[..., Flow]


def build_context(tmp_path: Path, **config: Any) -> RecorderContext:
    settings: dict[str, Any] = {"store_path": str(tmp_path / "records.db"), "store_indexer": "thread",
                                "probe_template": False, **config}
    return create_recorder_app(RecorderConfig(**settings)).recorder_context


async def open_session(ctx: RecorderContext, spec: SessionSpec | None = None) -> LiveSession:
    session, _ = ctx.sessions.new(spec or SessionSpec())
    await ctx.sessions.add(session)
    return session
