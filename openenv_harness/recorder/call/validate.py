"""Step: the engine's reply becomes token evidence (``recorder/validate.py`` says what makes it valid).

A sample the engine aborted part-way (a pause in abort mode, or the engine's own abort) ends the call
here: handed over, a cut-off reply would become the agent's next history -- a turn the policy never
finished. The agent is told to retry the whole call (a retryable 503); the pipeline's funnel records
the partial sample first (untrainable), and a retry is not answered from it (``dedupe.py``).
"""

from __future__ import annotations

from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.call.pending import ENGINE_ABORTED
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.validate import extract_evidence


def validate(flow: Flow) -> None:
    assert flow.reply is not None and flow.reply.json is not None
    flow.evidence = ev = extract_evidence(flow.reply.json, flow.prompt_ids)
    ev.reasons.extend(flow.reply.doubts)
    if ev.finish_reason == "abort":
        ev.reasons.append("engine aborted the call (finish_reason=abort): a partial sample, kept for inspection")
        error = AgentError(503, "the engine aborted this call part-way (a weight update or an engine abort); "
                           "retry the call", type="server_error", code=ENGINE_ABORTED,
                           headers={"retry-after": str(flow.ctx.config.retry_after_s)})
        error.engine_failure = True
        raise error
