"""The forward step alone: what it asks the reference engine, what it keeps, and how it fails."""

from __future__ import annotations

import orjson
import pytest

from openenv_harness.recorder.call.admit import enter, parse
from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.call.forward import CAPTURE_FIELDS, forward, upstream_body
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.session.spec import SessionSpec
from openenv_harness.testing.engine import EngineServer
from openenv_harness.testing.engine.faults import Fault
from openenv_harness.testing.model_step import ScriptedModelStep
from openenv_harness.testing.tflow import tcontext, tflow, tsession

from step_flows import MakeFlow, open_session

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "stream": True,
        "stream_options": {"include_usage": True}}


async def _entered(ctx: RecorderContext, make_flow: MakeFlow) -> Flow:
    flow = make_flow(ctx, await open_session(ctx), BODY)
    enter(flow)
    parse(flow)
    return flow


def test_the_engine_is_sent_the_agents_body_plus_the_capture_fields_only() -> None:
    sent = upstream_body(BODY, {"temperature": 1.0})
    assert {k: v for k, v in sent.items() if k not in CAPTURE_FIELDS} == {
        "model": "m", "messages": BODY["messages"], "temperature": 1.0, "top_logprobs": 0}
    assert all(sent[k] == v for k, v in CAPTURE_FIELDS.items())
    assert upstream_body({**BODY, "top_logprobs": 3})["top_logprobs"] == 3


async def test_forward_keeps_the_reply_its_prompt_ids_and_the_policy_version(
        engine_ctx: RecorderContext, engine: EngineServer, make_flow: MakeFlow) -> None:
    engine_ctx.fence.set_version(4)
    flow = await _entered(engine_ctx, make_flow)
    await forward(flow)
    assert flow.engine_asked and not flow.cancellable
    assert flow.reply is not None and flow.reply.status == 200 and flow.reply.json is not None
    assert flow.prompt_ids is not None and len(flow.prompt_ids) > 0
    # read from the engine's reply bytes by the session's reader (the parsed reply leaves them out)
    assert flow.prompt_ids.tolist() == orjson.loads(flow.reply.body)["prompt_token_ids"]
    assert (flow.version_start, flow.version_end) == (4, 4)
    assert engine_ctx.fence.inflight == 0
    sent = engine.requests(flow.session.id)[-1]["body"]
    assert sent["stream"] is False and sent["return_token_ids"] is True and "stream_options" not in sent


async def test_an_engine_error_is_raised_as_the_engines_failure(
        engine_ctx: RecorderContext, engine: EngineServer, make_flow: MakeFlow) -> None:
    flow = await _entered(engine_ctx, make_flow)
    engine.add_fault(flow.session.id, Fault(status=500, message="boom"))
    with pytest.raises(AgentError) as failed:
        await forward(flow)
    # the pipeline records a call the engine was asked and failed before the agent hears of it
    assert failed.value.engine_failure and flow.engine_asked and not flow.stored
    assert flow.reply is not None and flow.reply.status == 500
    assert engine_ctx.fence.inflight == 0


async def test_a_paused_fence_refuses_before_the_engine_is_asked(
        engine_ctx: RecorderContext, engine: EngineServer, make_flow: MakeFlow) -> None:
    flow = await _entered(engine_ctx, make_flow)
    before = len(engine.requests(flow.session.id))
    engine_ctx.fence.pause()
    with pytest.raises(AgentError) as refused:
        await forward(flow)
    assert (refused.value.status, refused.value.code) == (503, "engine_paused")
    assert not refused.value.engine_failure and not flow.engine_asked
    assert len(engine.requests(flow.session.id)) == before


async def test_the_prompt_mode_is_given_the_call_not_the_flow() -> None:
    """Full history relays the body and is given no engine facts; incremental gets the engine's facts
    and reports, on the call, why it did not continue (a chain's first call)."""
    ctx = tcontext(model_step=ScriptedModelStep([], final="hi"))
    plain, _ = await tsession(ctx)
    flow = tflow(ctx, plain)
    enter(flow)
    parse(flow)
    await forward(flow)
    call = flow.mode_call
    assert call is not None and call.facts is None and call.turn_end == [] and call.report is None
    assert call.upstream_body is flow.upstream_body and call.session_id == plain.id
    assert call.state is plain.prompt_mode_state

    incremental, _ = await tsession(ctx, SessionSpec(prompt_mode="incremental", prompt_mode_strict=True))
    agent = {"model": "m", "messages": [{"role": "user", "content": "list the files"}],
             "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]}
    flow = tflow(ctx, incremental, agent)
    enter(flow)
    parse(flow)
    await forward(flow)
    call = flow.mode_call
    upstream = ctx.upstream_for(None)
    assert upstream is not None and call is not None and call.strict and call.call_kind == "agent"
    assert call.facts is ctx.engine_facts.of(upstream)
    assert call.report is not None and call.report["reason"] == "chain_start" and not call.report["continued"]
