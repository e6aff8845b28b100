"""The steps after the engine answered, each alone: tool caps, record, reply; and the pipeline's
error funnel, which records a call the engine was asked before the agent hears of its failure."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from openenv_harness.recorder.call import pipeline
from openenv_harness.recorder.call.admit import dedupe, enter, parse
from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.call.forward import apply_tool_caps, forward, validate
from openenv_harness.recorder.call.record import record
from openenv_harness.recorder.call.pipeline import reply
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.dialects.routes import ANTHROPIC
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.session.spec import Budgets, SessionSpec
from openenv_harness.recorder.upstream.base import UpstreamReply
from openenv_harness.recorder.validate import extract_evidence
from openenv_harness.testing.engine import EngineServer
from openenv_harness.testing.engine.faults import Fault

from step_flows import MakeFlow, open_session

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]


def _calls(n: int) -> list[dict[str, object]]:
    return [{"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": f'{{"i": {i}}}'}}
            for i in range(n)]


def _answered(flow: Flow, tool_calls: int) -> None:
    """The flow as the engine would have answered it: a reply with ``tool_calls`` calls and its ids."""
    message = {"role": "assistant", "content": "", "tool_calls": _calls(tool_calls)}
    flow.reply = UpstreamReply(status=200, json={
        "id": "r", "model": "m", "prompt_token_ids": [1, 2, 3],
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls", "token_ids": [7, 8],
                     "logprobs": {"content": [{"token": "token_id:7", "logprob": -0.5},
                                              {"token": "token_id:8", "logprob": -0.25}]}}]})
    flow.evidence = extract_evidence(flow.reply.json, None)


async def test_a_per_turn_cap_hands_the_agent_the_first_calls_and_names_what_it_dropped(
        ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx, SessionSpec(budgets=Budgets(max_tool_calls_per_turn=1)))
    flow = make_flow(ctx, session, BODY)
    _answered(flow, 3)
    engine_json = flow.reply.json if flow.reply else None
    apply_tool_caps(flow)
    assert flow.reply is not None and flow.reply.json is not engine_json  # the engine's reply is not mutated
    assert [c["id"] for c in flow.reply.json["choices"][0]["message"]["tool_calls"]] == ["c0"]
    assert flow.tool_limit == {"cap": "max_tool_calls_per_turn", "sampled": 3, "delivered": 1,
                               "dropped": _calls(3)[1:]}
    assert session.counters.tool_calls == 1 and session.status == "open"


async def test_a_total_cap_cut_to_nothing_ends_the_turn_and_stops_the_session(
        ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx, SessionSpec(budgets=Budgets(max_total_tool_calls=0)))
    flow = make_flow(ctx, session, BODY)
    _answered(flow, 2)
    apply_tool_caps(flow)
    assert flow.reply is not None and flow.reply.json is not None
    choice = flow.reply.json["choices"][0]
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] == "stop"
    assert flow.stop == "max_total_tool_calls" and session.status == "open"  # the pipeline applies it
    await ctx.sessions.stop(session, flow.stop)
    assert (session.status, session.stop_reason) == ("stopped", "max_total_tool_calls")


async def test_record_makes_the_call_durable_and_fixes_the_agents_reply(
        engine_ctx: RecorderContext, make_flow: MakeFlow) -> None:
    ctx = engine_ctx
    session = await open_session(ctx)
    body = {**BODY, "logprobs": True, "tools": TOOLS}
    flow = make_flow(ctx, session, body)
    enter(flow)
    parse(flow)
    assert flow.call_kind == "agent"
    await forward(flow)
    validate(flow)
    apply_tool_caps(flow)
    await record(flow)
    assert flow.stored and flow.call_index == 0 and flow.agent_reply is not None
    assert flow.agent_reply["choices"][0]["logprobs"] is not None  # asked for: kept for the agent
    await ctx.store.caught_up()
    (stored,) = await ctx.store.read_records(session.id)
    md = stored["metadata"]
    assert (md["status"], md["trainable"], md["dialect"], md["call_index"]) == ("ok", True, "chat", 0)
    assert stored["response"] == flow.agent_reply
    assert flow.evidence is not None and stored["completion_token_ids"] == flow.evidence.completion_ids.tolist()
    # a retry of the same body is answered from the record, not sampled again
    retry = make_flow(ctx, session, body)
    enter(retry)
    parse(retry)
    assert await dedupe(retry) and retry.agent_reply == flow.agent_reply
    response = reply(retry)
    assert response.media_type == "application/json" and orjson.loads(response.body) == flow.agent_reply


async def test_a_dialect_reply_is_built_from_the_recorded_chat_completion(
        ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx)
    flow = make_flow(ctx, session, {"model": "m", "max_tokens": 8, "stream": True,
                                    "messages": [{"role": "user", "content": "hi"}]}, dialect=ANTHROPIC)
    enter(flow)
    parse(flow)
    flow.agent_reply = {"id": "x", "model": "m", "usage": {"prompt_tokens": 3, "completion_tokens": 1},
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                     "finish_reason": "stop"}]}
    response = reply(flow)
    events = bytes(response.body).decode()
    assert response.media_type == "text/event-stream"
    assert events.startswith("event: message_start") and events.rstrip().endswith('data: {"type":"message_stop"}')


async def test_the_funnel_records_an_engine_failure_before_answering(
        engine_ctx: RecorderContext, engine: EngineServer, make_flow: MakeFlow) -> None:
    ctx = engine_ctx
    session = await open_session(ctx)
    engine.add_fault(session.id, Fault(status=500, message="engine down"))
    flow = make_flow(ctx, session, BODY, dialect=ANTHROPIC)
    flow.raw = orjson.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    response = await pipeline.serve(flow, ctx.sessions)
    assert response.status_code == 500
    assert orjson.loads(response.body)["type"] == "error"  # in the dialect's error shape
    await ctx.store.caught_up()
    (stored,) = await ctx.store.read_records(session.id)
    assert stored["metadata"]["status"] == "failed" and stored["metadata"]["error"]["upstream_status"] == 500
    assert stored["metadata"]["dialect"] == "anthropic" and not stored["metadata"]["trainable"]


async def test_the_funnel_answers_a_refusal_without_a_record(ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx, SessionSpec(budgets=Budgets(max_calls=0)))
    response = await pipeline.serve(make_flow(ctx, session, BODY), ctx.sessions)
    assert response.status_code == 400 and orjson.loads(response.body)["error"]["code"] == "budget_exhausted"
    await ctx.store.caught_up()
    assert await ctx.store.read_records(session.id) == []


async def test_the_funnel_turns_a_recorder_bug_into_a_500_recorded_once_the_engine_was_asked(
        ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx)
    before = make_flow(ctx, session, BODY)
    error = await pipeline._funnel(before, KeyError("bug"))
    assert (error.status, error.code) == (500, "recorder_error")
    after = make_flow(ctx, session, BODY)
    after.engine_asked = True
    error = await pipeline._funnel(after, KeyError("bug"))
    assert (error.status, error.code) == (500, "recorder_error") and after.stored
    await ctx.store.caught_up()
    (stored,) = await ctx.store.read_records(session.id)
    assert stored["metadata"]["error"]["kind"] == "recorder_error"
    with pytest.raises(asyncio.CancelledError):  # a cancellation that is not a close is the server's
        await pipeline._funnel(after, asyncio.CancelledError())
    assert isinstance(await pipeline._funnel(after, AgentError(409, "x")), AgentError)
