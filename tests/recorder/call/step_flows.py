"""What step tests build: a recorder's parts in memory, a session, a flow by hand (``testing/tflow.py``).

Each step is a function of the flow (``recorder/call/``): a test builds the flow a step expects and
runs that step alone, on an in-memory store and, where a step asks the engine, a scripted sampler or
the reference engine over loopback HTTP (fixtures: ``conftest.py``).
"""

from __future__ import annotations

from typing import Any, Callable

from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.session.live import LiveSession
from openenv_harness.recorder.session.spec import SessionSpec
from openenv_harness.testing.tflow import tcontext, tsession

MakeFlow = Callable[..., Flow]


def build_context(**config: Any) -> RecorderContext:
    return tcontext(**config)


async def open_session(ctx: RecorderContext, spec: SessionSpec | None = None) -> LiveSession:
    session, _ = await tsession(ctx, spec)
    return session
