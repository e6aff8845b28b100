"""The enter and parse steps (parse classifies the call too) on a flow built by hand."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from openenv_harness.recorder.call.admit import enter, parse
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.dialects.routes import ANTHROPIC, RESPONSES
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.session.spec import AuxRule, SessionSpec

from refused_bodies import LIMIT, REFUSED
from step_flows import MakeFlow, build_context, open_session

CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
             "stream_options": {"include_usage": True}, "logprobs": True}


async def test_a_chat_body_enters_as_it_is_and_is_parsed_once(ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx)
    raw = orjson.dumps(CHAT_BODY)
    flow = make_flow(ctx, session, raw)
    enter(flow)
    parse(flow)
    assert flow.raw is raw and flow.body == CHAT_BODY
    assert flow.wants_stream and flow.include_usage and flow.keep_logprobs
    assert flow.digest == hashlib.sha256(raw).hexdigest()
    assert flow.dialect_call.raw_arguments == []


async def test_an_idempotency_key_names_the_call_whatever_its_bytes(ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx)
    digests = set()
    for body in (CHAT_BODY, {**CHAT_BODY, "stream": False}):
        flow = make_flow(ctx, session, body, headers={"idempotency-key": "k1"})
        enter(flow)
        parse(flow)
        digests.add(flow.digest)
    assert digests == {"idem:" + hashlib.sha256(b"k1").hexdigest()}


async def test_a_dialect_body_becomes_the_chat_body_it_is_stored_as(ctx: RecorderContext, make_flow: MakeFlow) -> None:
    session = await open_session(ctx)
    for dialect, body in ((RESPONSES, {"model": "m", "input": "hi", "stream": True}),
                          (ANTHROPIC, {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})):
        flow = make_flow(ctx, session, body, dialect=dialect)
        enter(flow)
        parse(flow)
        # the record's request is the chat body the engine rendered, and its bytes are what is digested
        assert flow.raw == orjson.dumps(flow.body)
        assert flow.body["messages"][-1] == {"role": "user", "content": "hi"}
        assert flow.digest == hashlib.sha256(flow.raw).hexdigest()


@pytest.mark.parametrize(("raw", "status", "code"), [r for r in REFUSED if r[1] != 413])
async def test_a_body_the_recorder_cannot_forward_unchanged_is_refused(
        raw: bytes, status: int, code: str, make_flow: MakeFlow) -> None:
    """What the body holds; its size is the edge's to refuse (``request_body.receive_body``,
    ``test_bad_input.py`` holds the whole path to the same table, 413 rows included)."""
    small = build_context(max_body_bytes=LIMIT)
    session = await open_session(small)
    flow = make_flow(small, session, raw)
    with pytest.raises(AgentError) as refused:
        enter(flow)
        parse(flow)
    assert (refused.value.status, refused.value.code) == (status, code)


async def test_a_dialects_chat_translation_over_the_limit_is_refused_as_too_large(make_flow: MakeFlow) -> None:
    """An Anthropic body within the limit whose chat translation is not (the system prompt and tool
    schemas are restated) is refused before the engine, as the edge would refuse a body that size."""
    small = build_context(max_body_bytes=LIMIT)
    session = await open_session(small)
    body = {"model": "m", "max_tokens": 8, "system": "", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": f"tool_{i}", "description": "d", "input_schema": {"type": "object"}}
                      for i in range(24)]}
    body["system"] = "s" * (LIMIT - len(orjson.dumps(body)) - 16)  # just within the limit as sent
    raw = orjson.dumps(body)
    assert len(raw) <= LIMIT
    flow = make_flow(small, session, raw, dialect=ANTHROPIC)
    enter(flow)
    assert len(flow.raw) > LIMIT
    with pytest.raises(AgentError) as refused:
        parse(flow)
    assert (refused.value.status, refused.value.code) == (413, "body_too_large")


async def test_the_sessions_rules_classify_an_auxiliary_call(ctx: RecorderContext, make_flow: MakeFlow) -> None:
    rule = AuxRule(name="title", system_prompt_contains="Generate a title")
    session = await open_session(ctx, SessionSpec(aux_rules=[rule]))
    title = {"messages": [{"role": "system", "content": "Generate a title for this"}, {"role": "user", "content": "x"}]}
    for body, kind in ((title, "aux"), (CHAT_BODY, "agent")):
        flow = make_flow(ctx, session, body)
        enter(flow)
        parse(flow)
        assert flow.call_kind == kind
    assert flow.aux_rule is None
