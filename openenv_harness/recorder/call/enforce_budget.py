"""Step: the session's budgets, before the engine is asked (``recorder/session/budget.py`` says what each counts).

The agent is answered with a 400 -- the supported CLIs end promptly on one, with no retry storm --
and nothing synthetic is recorded as a policy sample.
"""

from __future__ import annotations

import time

from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.errors import AgentError


def enforce_budget(flow: Flow) -> None:
    """A stopped session, or a call that would pass one of its caps, is refused (and the cap stops it)."""
    session = flow.session
    if session.status == "stopped":
        flow.ctx.metrics.rejected.labels("stopped").inc()
        raise AgentError(400, f"rollout budget exhausted ({session.stop_reason}); stop now", code="budget_exhausted")
    cap = session.ledger.exceeded(flow.call_kind, time.time() - session.created_at)
    if cap is not None:
        flow.stop = cap  # the pipeline stops the session before the refusal is answered
        flow.ctx.metrics.budget_stops.labels(cap).inc()
        flow.ctx.metrics.rejected.labels("budget").inc()
        raise AgentError(400, f"rollout budget exhausted ({cap}); stop now", code="budget_exhausted")
