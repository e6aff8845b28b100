"""The record step's parts, on the in-memory flow: the one builder of a stored record, the commit,
and the hooks after it -- for an answered call, an aborted one (through the pipeline's funnel), a
failed one, and a commit the store refuses."""

from __future__ import annotations

import pytest

from openenv_harness.recorder.call import pipeline
from openenv_harness.recorder.call.record import HOOKS, record
from openenv_harness.recorder.call.admit import enter, parse
from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.call.forward import validate
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.session.spec import SessionSpec
from openenv_harness.testing.memory_store import MemoryStore
from openenv_harness.testing.tflow import answered, tflow, tool_calls

from step_flows import open_session


#: an agent call: the request offers tools (one without is an auxiliary call: ``classify.py``)
AGENT_BODY = {"model": "m", "messages": [{"role": "user", "content": "list the files"}],
              "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]}


def _metric(ctx: RecorderContext, name: str, **labels: str) -> float:
    return ctx.metrics.registry.get_sample_value(name, labels) or 0.0


async def _parsed(ctx: RecorderContext, spec: SessionSpec | None = None, body: dict | None = None) -> Flow:
    flow = tflow(ctx, await open_session(ctx, spec), body or AGENT_BODY)
    enter(flow)
    parse(flow)
    return flow


def test_the_hooks_run_in_this_order() -> None:
    assert [h.__name__ for h in HOOKS] == ["place_in_chain", "count", "remember_for_retries", "commit_prompt_mode"]


async def test_an_answered_call_is_stored_then_placed_counted_and_remembered(ctx: RecorderContext) -> None:
    flow = answered(await _parsed(ctx), tool_calls=tool_calls(1))
    validate(flow)
    await record(flow)
    session = flow.session
    (stored,) = await ctx.store.read_records(session.id)
    md = stored["metadata"]
    assert (md["status"], md["trainable"], md["partial"], md["fidelity"]["class"]) == ("ok", True, False, "root")
    assert md["limits"]["calls"] == 1 and stored["response"] == flow.agent_reply
    assert stored["prompt_token_ids"] == [1, 2, 3] and stored["per_token_logps"] == [-0.25, -0.5]
    assert session.chain.tip_ids == [md["node_id"]] and session.replay.first_attempt(flow.digest) is not None
    assert (session.counters.calls, session.counters.agent_calls, session.counters.prompt_tokens) == (1, 1, 3)
    assert _metric(ctx, "oeh_records_stored_total") == 1
    assert _metric(ctx, "oeh_calls_total", call_kind="agent", status="ok") == 1


async def test_an_aborted_call_is_recorded_by_the_funnel_with_its_partial_ids(ctx: RecorderContext) -> None:
    flow = answered(await _parsed(ctx), completion=[7], finish_reason="abort")
    flow.engine_asked = True
    with pytest.raises(AgentError) as ended:
        validate(flow)
    error = await pipeline._funnel(flow, ended.value)
    assert (error.status, error.code) == (503, "engine_aborted") and flow.stored
    (stored,) = await ctx.store.read_records(flow.session.id)
    md = stored["metadata"]
    assert (md["status"], md["trainable"], md["partial"], md["finish_reason"]) == ("invalid", False, True, "abort")
    assert md["error"]["kind"] == "engine_aborted" and md["error"]["status"] == 503
    assert stored["completion_token_ids"] == [7] and stored["loss_mask"][-1] == 0
    session = flow.session
    # counted as a record, not as a served sample; never a retry's answer, never a chain tip
    assert (session.counters.calls, session.counters.agent_calls, session.counters.prompt_tokens) == (1, 0, 0)
    assert session.counters.invalid_calls == 1 and session.counters.failed_calls == 0
    assert session.last_error is not None and session.last_error["kind"] == "engine_aborted"
    assert session.replay.first_attempt(flow.digest) is None and session.chain.tip_ids == []
    assert _metric(ctx, "oeh_errors_total", kind="engine_aborted") == 1


async def test_a_failed_call_is_recorded_without_ids_and_a_cancelled_one_is_no_error(
        ctx: RecorderContext) -> None:
    flow = await _parsed(ctx)
    flow.engine_asked = True
    failure = AgentError(502, "engine down", code="upstream_error")
    failure.engine_failure = True
    await pipeline._funnel(flow, failure)
    (stored,) = await ctx.store.read_records(flow.session.id)
    assert stored["metadata"]["status"] == "failed" and stored["prompt_token_ids"] == []
    assert stored["metadata"]["error"]["kind"] == "upstream_error" and flow.session.counters.failed_calls == 1
    assert flow.session.last_error is not None and flow.session.last_error["message"] == "engine down"
    flow.session.last_error = None
    cancelled = tflow(ctx, flow.session)
    enter(cancelled)
    parse(cancelled)
    from openenv_harness.recorder.call.record import record_failure

    await record_failure(cancelled, AgentError(409, "closed", code="session_closed"), kind="cancelled")
    assert flow.session.last_error is None and flow.session.counters.failed_calls == 2


@pytest.mark.parametrize("aborted", [False, True])
async def test_a_refused_commit_gives_back_the_number_and_the_budget_and_runs_no_hook(
        ctx: RecorderContext, aborted: bool) -> None:
    assert isinstance(ctx.store, MemoryStore)
    flow = answered(await _parsed(ctx), finish_reason="abort" if aborted else None)
    flow.engine_asked = True
    ctx.store.fail_appends = OSError("disk full")
    try:
        validate(flow)
        await record(flow)
    except AgentError as exc:
        error = await pipeline._funnel(flow, exc)
    assert (error.status, error.code) == (503, "store_unavailable")
    session = flow.session
    assert session.numbers.next == 0 and flow.call_index == -1
    assert (session.counters.calls, session.counters.agent_calls, session.counters.prompt_tokens,
            session.counters.completion_tokens) == (0, 0, 0, 0)
    assert session.replay.first_attempt(flow.digest) is None and session.last_error is None
    assert _metric(ctx, "oeh_records_stored_total") == 0


async def test_a_compaction_calls_summary_is_kept_once_its_record_is_stored(ctx: RecorderContext) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Summarize the conversation so far"}]}
    flow = await _parsed(ctx, body=body)
    flow.call_kind, flow.aux_rule = "aux", "compaction"
    answered(flow, content="The agent listed the files.")
    validate(flow)
    await record(flow)
    assert flow.session.chain.summaries == ("The agent listed the files.",)
