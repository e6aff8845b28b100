"""The dedupe step alone: a retry is answered from its in-flight twin or from its stored record, else it
goes on to the engine untouched."""

from __future__ import annotations

import asyncio
import hashlib
import time
from array import array
from pathlib import Path
from typing import Any

from openenv_harness.recorder.call.admit import dedupe
from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.session.live import LiveSession
from openenv_harness.recorder.store.base import PendingRecord

from step_flows import MakeFlow, build_context, open_session

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
REPLY = {"id": "r1", "model": "m", "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi there"},
                                                "finish_reason": "stop"}]}


def _flow(ctx: RecorderContext, session: LiveSession, make_flow: MakeFlow) -> Flow:
    """A flow as the parse step leaves it: its digest names the body."""
    flow = make_flow(ctx, session, BODY)
    flow.body = dict(BODY)
    flow.digest = hashlib.sha256(flow.raw).hexdigest()
    return flow


def _untouched(flow: Flow) -> bool:
    return flow.agent_reply is None and not flow.replayed


async def _store(ctx: RecorderContext, flow: Flow, *, status: str = "ok", response: dict[str, Any] = REPLY,
                 recent: bool = True) -> None:
    """A record of the flow's call as the record step makes it durable (and, with ``recent``, notes its digest)."""
    index = flow.session.numbers.take()
    await ctx.store.append(PendingRecord(
        session_id=flow.session.id, call_index=index, call_kind="agent", status=status,
        request=flow.body, request_json=flow.raw, response=response,
        prompt_ids=array("I", [1, 2, 3]), completion_ids=array("I", [7, 8]), logprobs=array("d", [-0.5, -0.25]),
        completion_tokens=None, trainable=status == "ok",
        metadata={"node_id": f"{flow.session.id}/{index}", "session_id": flow.session.id, "call_index": index,
                  "request_digest": flow.digest, "status": status},
        created_at=time.time()))
    await ctx.store.caught_up()
    if recent:
        flow.session.replay.remember(flow.digest, index, window=8)


async def test_a_call_with_no_twin_and_no_record_goes_on_untouched(ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx)
    flow = _flow(ctx, session, make_flow)
    assert await dedupe(flow) is False
    assert _untouched(flow)
    session.replay.open_twin("another digest")  # another call's twin
    assert await dedupe(flow) is False and _untouched(flow)


async def test_a_retry_waits_on_its_in_flight_twin_and_is_answered_with_its_reply(
        ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx)
    flow = _flow(ctx, session, make_flow)
    twin = session.replay.open_twin(flow.digest)
    retry = asyncio.create_task(dedupe(flow))
    await asyncio.sleep(0)
    assert not retry.done()  # waiting on the first attempt
    twin.set_result(REPLY)
    assert await asyncio.wait_for(retry, 1.0) is True
    assert flow.agent_reply is REPLY and flow.replayed


async def test_a_retry_of_a_twin_already_answered_replays_at_once(ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx)
    flow = _flow(ctx, session, make_flow)
    twin = session.replay.open_twin(flow.digest)
    twin.set_result(REPLY)
    assert await dedupe(flow) is True and flow.agent_reply is REPLY and flow.replayed


async def test_a_retry_whose_twin_failed_gets_a_fresh_attempt(ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx)
    flow = _flow(ctx, session, make_flow)
    twin = session.replay.open_twin(flow.digest)
    retry = asyncio.create_task(dedupe(flow))
    await asyncio.sleep(0)
    twin.set_exception(AgentError(503, "engine down", type="server_error"))  # how the pipeline fails a twin
    assert await asyncio.wait_for(retry, 1.0) is False
    assert _untouched(flow)


async def test_a_twin_that_resolves_to_nothing_is_not_a_replay(ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx)
    flow = _flow(ctx, session, make_flow)
    twin = session.replay.open_twin(flow.digest)
    twin.set_result(None)
    assert await dedupe(flow) is False
    assert _untouched(flow)


async def test_a_retry_cancelled_while_waiting_leaves_its_twin_running(ctx: RecorderContext,
                                                                      make_flow: MakeFlow) -> None:
    session = await open_session(ctx)
    flow = _flow(ctx, session, make_flow)
    twin = session.replay.open_twin(flow.digest)
    retry = asyncio.create_task(dedupe(flow))
    await asyncio.sleep(0)
    retry.cancel()  # e.g. a close cancelling the waiting retry
    await asyncio.gather(retry, return_exceptions=True)
    assert retry.cancelled() and not twin.done()  # the first attempt still gets its answer
    twin.set_result(REPLY)


async def test_a_retry_of_a_recorded_call_is_answered_with_the_records_response(
        ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx)
    first = _flow(ctx, session, make_flow)
    await _store(ctx, first)
    retry = _flow(ctx, session, make_flow)
    assert await dedupe(retry) is True
    assert retry.agent_reply == REPLY and retry.replayed


async def test_only_the_latest_ok_record_of_a_recent_digest_is_replayed(ctx: RecorderContext,
                                                                        make_flow: MakeFlow) -> None:
    session = await open_session(ctx)
    first = _flow(ctx, session, make_flow)
    await _store(ctx, first, recent=False)  # recorded, but its digest has left the recent window
    assert await dedupe(_flow(ctx, session, make_flow)) is False
    invalid = {**REPLY, "id": "r-invalid"}
    await _store(ctx, first, status="invalid", response=invalid)  # the digest is recent; its last record is invalid
    later = {**REPLY, "id": "r2"}
    retry = _flow(ctx, session, make_flow)
    assert await dedupe(retry) is True and retry.agent_reply == REPLY  # the ok record, not the invalid one
    await _store(ctx, first, response=later)
    retry = _flow(ctx, session, make_flow)
    assert await dedupe(retry) is True and retry.agent_reply == later


async def test_a_recent_digest_with_no_ok_record_is_not_a_replay(ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx)
    flow = _flow(ctx, session, make_flow)
    session.replay.remember(flow.digest, 0, window=8)  # noted, but no record holds it
    assert await dedupe(flow) is False and _untouched(flow)
    await _store(ctx, flow, status="invalid")
    assert await dedupe(flow) is False and _untouched(flow)


async def test_an_in_flight_twin_is_preferred_to_the_stored_record(ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx)
    flow = _flow(ctx, session, make_flow)
    await _store(ctx, flow)
    fresh = {**REPLY, "id": "in-flight"}
    twin = session.replay.open_twin(flow.digest)
    twin.set_result(fresh)
    assert await dedupe(flow) is True and flow.agent_reply is fresh


async def test_with_the_dedupe_window_off_a_recorded_call_is_sampled_again(tmp_path: Path,
                                                                          make_flow: MakeFlow) -> None:
    ctx = build_context(dedupe_window=0)
    ctx.store.open()
    try:
        session = await open_session(ctx)
        flow = _flow(ctx, session, make_flow)
        await _store(ctx, flow)
        assert await ctx.store.find_by_digest(session.id, flow.digest) is not None  # the record is there
        retry = _flow(ctx, session, make_flow)
        assert await dedupe(retry) is False and _untouched(retry)
        # an in-flight twin still answers its retry: the window is about stored records only
        twin = session.replay.open_twin(retry.digest)
        twin.set_result(REPLY)
        assert await dedupe(retry) is True and retry.agent_reply is REPLY
    finally:
        ctx.store.close()

