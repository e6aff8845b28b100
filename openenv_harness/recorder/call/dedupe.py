"""Step: a retried call (identical body in the same session) is answered from the record.

Both CLIs resend byte-identical bodies on retry; sampling again would put a second, different
answer in the trace for one agent turn. A replay is exactly what the first attempt was sent --
from its in-flight twin, or from the stored record's ``response``, which keeps the logprobs when the
call asked for them (``record.py``) -- so a retry under the same ``Idempotency-Key`` whose body
differs gets the logical call's one answer too.
"""

from __future__ import annotations

import asyncio

from openenv_harness.recorder.call.flow import Flow


async def dedupe(flow: Flow) -> bool:
    """Whether the call was answered from its twin or its record (``flow.agent_reply``)."""
    session = flow.session
    twin = session.replay.twin(flow.digest)
    if twin is not None:
        try:
            flow.agent_reply = await asyncio.shield(twin)
        except Exception:
            return False  # the twin failed: this retry gets a fresh attempt
        flow.replayed = flow.agent_reply is not None
        return flow.replayed
    if flow.ctx.config.dedupe_window and session.replay.is_recent(flow.digest):
        entry = await flow.ctx.store.find_by_digest(session.id, flow.digest)
        if entry is not None:
            flow.agent_reply = entry["response"]
            flow.replayed = True
            return True
    return False
