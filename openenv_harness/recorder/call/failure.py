"""A call that reached the engine but got no usable answer is recorded too -- untrainable, with the
original error -- before the agent hears of it. Called from one place: the pipeline's error funnel."""

from __future__ import annotations

import time

from openenv_harness.recorder.call.durable import store_record
from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.call.metadata import base_metadata
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.store.base import PendingRecord


async def record_failure(flow: Flow, error: AgentError, *, kind: str | None = None) -> None:
    """A call that reached the engine but got no usable answer: kept with the original error."""
    session = flow.session
    md = base_metadata(flow, "failed", False)
    md["error"] = {
        "kind": kind or error.code or "upstream",
        "status": error.status,
        "upstream_status": flow.reply.status if flow.reply is not None else None,
        "message": error.message,
        "upstream_body": error.upstream_body,
    }
    if flow.prompt_mode is not None:  # incremental: which step of the continuation failed
        md["prompt_mode"] = flow.prompt_mode
    session.ledger.account(flow.call_kind, None, served=False)
    md["limits"] = session.limits()
    pending = PendingRecord(
        session_id=session.id, call_index=flow.call_index, call_kind=flow.call_kind, status="failed",
        request=flow.body, response={}, prompt_ids=None, completion_ids=None, logprobs=None,
        completion_tokens=None, trainable=False, metadata=md, created_at=time.time(),
    )
    await store_record(flow, pending)
    session.ledger.note_failed()
    if kind != "cancelled":  # ``last_error`` is what failed a call; a close cancelling one is no failure
        session.note_error({**md["error"], "call_index": flow.call_index, "at": time.time()})
    flow.ctx.metrics.records.inc()
    flow.ctx.metrics.calls.labels(flow.call_kind, "failed").inc()
    flow.ctx.metrics.errors.labels(md["error"]["kind"]).inc()
