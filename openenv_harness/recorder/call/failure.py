"""A call that reached the engine but got no usable answer is recorded too -- untrainable, with the
original error -- before the agent hears of it. Called from one place: the pipeline's error funnel."""

from __future__ import annotations

from openenv_harness.recorder.call.after_commit import after_commit
from openenv_harness.recorder.call.durable import store_record
from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.call.pending import failed_record
from openenv_harness.recorder.errors import AgentError


async def record_failure(flow: Flow, error: AgentError, *, kind: str | None = None) -> None:
    """A call that reached the engine but got no usable answer (an aborted one with its partial ids)."""
    pending = failed_record(flow, error, kind)
    seq = await store_record(flow, pending)
    after_commit(flow, pending, seq)
