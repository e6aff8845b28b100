"""The enforce_budget step alone: a stopped session, or a call that would pass a cap, is refused with a 400
before the engine is asked, and the cap becomes the session's stop reason (in memory and in its store row)."""

from __future__ import annotations

import time

import pytest

from openenv_harness.recorder.call import pipeline
from openenv_harness.recorder.call.admit import enforce_budget
from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.session.budget import Counters
from openenv_harness.recorder.session.spec import Budgets, SessionSpec

from step_flows import MakeFlow, open_session

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _count(ctx: RecorderContext, name: str, **labels: str) -> float:
    value = ctx.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _stop_counts(ctx: RecorderContext, cap: str) -> tuple[float, float, float]:
    return (_count(ctx, "oeh_rejected_total", reason="stopped"), _count(ctx, "oeh_rejected_total", reason="budget"),
            _count(ctx, "oeh_budget_stops_total", cap=cap))


def _stored_row(ctx: RecorderContext, session_id: str) -> tuple[str, str | None]:
    (row,) = [r for r in ctx.store.load_sessions() if r.session_id == session_id]
    return row.status, row.stop_reason


async def _refused(flow: Flow) -> AgentError:
    """The step refuses the call; the stop it sets is applied as the pipeline applies it."""
    with pytest.raises(AgentError) as refused:
        enforce_budget(flow)
    assert flow.stop is None or flow.session.status == "open"  # the step itself changes no session
    if flow.stop is not None:
        await flow.ctx.sessions.stop(flow.session, flow.stop)
    return refused.value


async def test_a_stopped_session_is_refused_naming_its_stop_reason(ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx)
    await ctx.sessions.stop(session, "max_total_tool_calls")
    for attempt in (1, 2):
        error = await _refused(make_flow(ctx, session, BODY))
        assert (error.status, error.code, error.type) == (400, "budget_exhausted", "invalid_request_error")
        assert error.message == "rollout budget exhausted (max_total_tool_calls); stop now"
        assert _stop_counts(ctx, "max_total_tool_calls") == (attempt, 0, 0)  # refused, not stopped again
    assert (session.status, session.stop_reason) == ("stopped", "max_total_tool_calls")


@pytest.mark.parametrize(("budgets", "spent", "cap"), [
    (Budgets(max_calls=3), Counters(calls=3, agent_calls=1), "max_calls"),
    (Budgets(max_agent_calls=2, max_calls=10), Counters(calls=4, agent_calls=2), "max_agent_calls"),
    (Budgets(max_prompt_tokens=100), Counters(calls=1, prompt_tokens=100), "max_prompt_tokens"),
    (Budgets(max_completion_tokens=50), Counters(calls=1, completion_tokens=60), "max_completion_tokens"),
    (Budgets(max_total_tokens=100, max_prompt_tokens=1000), Counters(calls=2, prompt_tokens=70, completion_tokens=30),
     "max_total_tokens"),
])
async def test_a_call_that_would_pass_a_cap_is_refused_and_stops_the_session_with_it(
        ctx: RecorderContext, make_flow: MakeFlow, budgets: Budgets, spent: Counters, cap: str) -> None:
    session = await open_session(ctx, SessionSpec(budgets=budgets))
    session.ledger.counters = spent  # what ``budget.account`` leaves after the calls the session made
    error = await _refused(make_flow(ctx, session, BODY))
    assert (error.status, error.code) == (400, "budget_exhausted")
    assert error.message == f"rollout budget exhausted ({cap}); stop now"
    assert (session.status, session.stop_reason) == ("stopped", cap)
    assert _stored_row(ctx, session.id) == ("stopped", cap)  # persisted: a restarted recorder keeps refusing
    assert _stop_counts(ctx, cap) == (0, 1, 1)
    # the next call meets a stopped session: refused as such, the cap counted once
    error = await _refused(make_flow(ctx, session, BODY))
    assert error.message == f"rollout budget exhausted ({cap}); stop now"
    assert _stop_counts(ctx, cap) == (1, 1, 1)


async def test_the_wall_clock_cap_counts_from_the_sessions_creation(ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx, SessionSpec(budgets=Budgets(max_wall_clock_s=60.0)))
    enforce_budget(make_flow(ctx, session, BODY))  # just created: well within
    session.created_at = time.time() - 61.0
    error = await _refused(make_flow(ctx, session, BODY))
    assert error.code == "budget_exhausted" and session.stop_reason == "max_wall_clock_s"


async def test_a_call_within_its_budgets_passes_and_changes_nothing(ctx: RecorderContext, make_flow: MakeFlow) -> None:
    budgets = Budgets(max_calls=3, max_agent_calls=2, max_prompt_tokens=100, max_completion_tokens=50,
                      max_total_tokens=140, max_wall_clock_s=3600.0)
    session = await open_session(ctx, SessionSpec(budgets=budgets))
    session.ledger.counters = Counters(calls=2, agent_calls=1, prompt_tokens=99, completion_tokens=40)
    flow = make_flow(ctx, session, BODY)
    enforce_budget(flow)
    assert (session.status, session.stop_reason) == ("open", None)
    assert session.counters == Counters(calls=2, agent_calls=1, prompt_tokens=99, completion_tokens=40)
    assert _stored_row(ctx, session.id) == ("open", None)
    assert _stop_counts(ctx, "max_calls") == (0, 0, 0)
    assert not flow.replayed and flow.agent_reply is None and flow.stop is None


async def test_max_agent_calls_refuses_an_agent_call_but_lets_an_aux_call_through(
        ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx, SessionSpec(budgets=Budgets(max_agent_calls=1, max_calls=5)))
    session.ledger.counters = Counters(calls=1, agent_calls=1)
    aux = make_flow(ctx, session, BODY)
    aux.call_kind = "aux"  # what ``parse`` sets for a call an aux rule matches
    enforce_budget(aux)
    assert session.status == "open"
    agent = make_flow(ctx, session, BODY)
    assert agent.call_kind == "agent"
    error = await _refused(agent)
    assert error.code == "budget_exhausted" and session.stop_reason == "max_agent_calls"
    # once stopped, an aux call is refused too
    aux_after = make_flow(ctx, session, BODY)
    aux_after.call_kind = "aux"
    assert (await _refused(aux_after)).message == "rollout budget exhausted (max_agent_calls); stop now"


async def test_max_calls_counts_aux_calls_too(ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx, SessionSpec(budgets=Budgets(max_calls=2, max_agent_calls=5)))
    session.ledger.counters = Counters(calls=2, agent_calls=0)  # two aux calls were recorded
    aux = make_flow(ctx, session, BODY)
    aux.call_kind = "aux"
    assert (await _refused(aux)).code == "budget_exhausted"
    assert session.stop_reason == "max_calls"


async def test_a_stop_that_cannot_be_persisted_still_refuses_the_call(ctx: RecorderContext, make_flow: MakeFlow) -> None:
    """The store fails while the cap's stop is persisted: the session is stopped in memory and the
    agent still gets its 400, not a server error."""
    session = await open_session(ctx, SessionSpec(budgets=Budgets(max_calls=0)))

    async def broken(row: object) -> None:
        raise OSError("disk full")

    ctx.store.put_session = broken  # type: ignore[method-assign]
    response = await pipeline.serve(make_flow(ctx, session, BODY), ctx.sessions)
    assert response.status_code == 400 and (session.status, session.stop_reason) == ("stopped", "max_calls")
