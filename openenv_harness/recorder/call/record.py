"""Step: one durable record of the call, before the agent gets its reply (D14).

Built (``pending.py``: what the call was, what the engine applied, which budget it spent, how its
prompt relates to its chain's -- ``observe.py`` -- and how the prompt mode served it), committed
(``durable.py``), and only then followed by what later calls see (``after_commit.py``). A call the
engine failed or aborted is recorded by the pipeline's funnel, through the same builder and hooks.
"""

from __future__ import annotations

from openenv_harness.recorder.call.after_commit import after_commit
from openenv_harness.recorder.call.durable import store_record
from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.call.observe import observe_chain
from openenv_harness.recorder.call.pending import served_metadata, served_record


async def record(flow: Flow) -> None:
    ev = flow.evidence
    assert ev is not None
    md = served_metadata(flow, ev)
    await observe_chain(flow, md, ev)
    pending = served_record(flow, ev, md)
    seq = await store_record(flow, pending)
    flow.agent_reply = pending.response
    after_commit(flow, pending, seq)
