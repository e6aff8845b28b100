"""The validate step alone, on the in-memory flow: evidence from the reply, and an aborted sample
ending the call (the funnel then records its partial ids: ``test_record_parts.py``)."""

from __future__ import annotations

import pytest

from openenv_harness.recorder.call.admit import enter, parse
from openenv_harness.recorder.call.forward import validate
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.upstream.base import UpstreamReply
from openenv_harness.testing.tflow import answered, tflow

from step_flows import open_session


async def test_a_reply_becomes_evidence_with_the_transports_doubts(ctx: RecorderContext) -> None:
    flow = answered(tflow(ctx, await open_session(ctx)), prompt=[5, 6], completion=[9])
    assert flow.reply is not None
    flow.reply.doubts = ["the transport read this reply's ids twice"]
    validate(flow)
    ev = flow.evidence
    assert ev is not None and ev.prompt_ids is not None and ev.completion_ids is not None and ev.logprobs is not None
    assert (ev.prompt_ids.tolist(), ev.completion_ids.tolist(), ev.logprobs.tolist()) == ([5, 6], [9], [-0.25])
    assert ev.reasons == ["the transport read this reply's ids twice"] and not ev.valid


async def test_an_aborted_sample_ends_the_call_with_a_retryable_error(ctx: RecorderContext) -> None:
    flow = tflow(ctx, await open_session(ctx))
    enter(flow)
    parse(flow)
    answered(flow, finish_reason="abort")
    with pytest.raises(AgentError) as ended:
        validate(flow)
    error = ended.value
    assert (error.status, error.code, error.engine_failure) == (503, "engine_aborted", True)
    assert error.headers == {"retry-after": str(ctx.config.retry_after_s)}
    assert flow.evidence is not None and flow.evidence.reasons[-1].startswith("engine aborted the call")


async def test_a_reply_with_missing_ids_is_kept_as_invalid_evidence(ctx: RecorderContext) -> None:
    flow = tflow(ctx, await open_session(ctx))
    flow.reply = UpstreamReply(status=200, json={"choices": [{"index": 0, "message": {"role": "assistant",
                                                                                      "content": "x"}}]})
    validate(flow)
    assert flow.evidence is not None and not flow.evidence.valid and flow.evidence.prompt_ids is None
