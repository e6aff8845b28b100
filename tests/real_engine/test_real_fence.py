"""The weight fence through the recorder on the real vLLM (dev mode), with a call in flight.

The call is made long on purpose (``ignore_eos`` and a few hundred tokens: many seconds on this
CPU), so the pause lands while vLLM is generating it whatever else the machine is doing; the
assertions are about versions, statuses and ids, never about time.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest

from real_stack import MODEL, RealStack
from openenv_harness.engine import VLLMServer

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
#: an agent call (it offers tools), long on purpose: the pause lands while it is being generated
LONG = {"model": MODEL, "messages": [{"role": "user", "content": "Count from one to one thousand in words."}],
        "tools": TOOLS, "max_tokens": 240, "ignore_eos": True, "temperature": 0}


def _in_flight(stack: RealStack, call: Future) -> None:
    """Until the recorder has forwarded the call (and vLLM had a moment to schedule it)."""
    deadline = time.monotonic() + 120
    while stack.admin.health()["fence"]["inflight"] < 1:
        assert not call.done(), call.result().text
        assert time.monotonic() < deadline, "the call never reached the engine"
        time.sleep(0.05)
    time.sleep(0.5)


def _start(stack: RealStack, pool: ThreadPoolExecutor) -> tuple[str, str, Future]:
    sid, secret = stack.session()
    return sid, secret, pool.submit(stack.chat, sid, secret, LONG)


def test_keep_freezes_the_call_and_flags_the_straddle(stack: RealStack, vllm: VLLMServer) -> None:
    with ThreadPoolExecutor(1) as pool:
        sid, _, call = _start(stack, pool)
        _in_flight(stack, call)
        paused = stack.admin.pause_engine("keep")
        assert paused["paused"] is True and paused["engine"] == {"status": "paused"}
        assert httpx.get(vllm.url + "/is_paused").json() == {"is_paused": True}
        resumed = stack.admin.resume_engine()
        assert resumed["policy_version"] == 1
        reply = call.result(timeout=600)
    assert reply.status_code == 200, reply.text
    [record] = stack.admin.records(sid)
    md = record["metadata"]
    assert md["status"] == "ok" and md["trainable"] is True
    assert (md["policy_version_start"], md["policy_version_end"], md["straddled_sync"]) == (0, 1, True)
    assert len(record["completion_token_ids"]) == LONG["max_tokens"]  # finished in full after the resume


def test_wait_lets_the_call_finish_before_the_pause(stack: RealStack) -> None:
    with ThreadPoolExecutor(1) as pool:
        sid, _, call = _start(stack, pool)
        _in_flight(stack, call)
        stack.admin.pause_engine("wait")  # returns once vLLM's in-flight calls are done
        # the recorder still records and replies after vLLM finished it: wait for that, then resume --
        # the call must have ended at the old version, unstraddled
        reply = call.result(timeout=120)
        stack.admin.resume_engine()
    assert reply.status_code == 200, reply.text
    [record] = stack.admin.records(sid)
    md = record["metadata"]
    assert md["status"] == "ok" and (md["policy_version_start"], md["policy_version_end"]) == (0, 0)
    assert md["straddled_sync"] is False
    assert len(record["completion_token_ids"]) == LONG["max_tokens"]


def test_abort_records_a_partial_sample_and_the_agent_retries(stack: RealStack) -> None:
    with ThreadPoolExecutor(1) as pool:
        sid, secret, call = _start(stack, pool)
        _in_flight(stack, call)
        stack.admin.pause_engine("abort")
        reply = call.result(timeout=600)
        # vLLM answers an aborted call with HTTP 200 and finish_reason "abort": the agent must not
        # take that as an answer
        assert reply.status_code == 503, reply.text
        assert reply.json()["error"]["code"] == "engine_aborted" and reply.headers["retry-after"]
        stack.admin.resume_engine()
        retry = stack.chat(sid, secret, {**LONG, "max_tokens": 8})
    assert retry.status_code == 200, retry.text
    aborted, answered = stack.admin.records(sid)
    md = aborted["metadata"]
    assert md["status"] == "invalid" and md["trainable"] is False and md["partial"] is True
    assert md["finish_reason"] == "abort" and md["error"]["kind"] == "engine_aborted"
    assert len(aborted["completion_token_ids"]) < LONG["max_tokens"]  # the partial ids, kept for inspection
    assert len(aborted["per_token_logps"]) == len(aborted["completion_token_ids"])
    assert answered["metadata"]["status"] == "ok" and answered["metadata"]["policy_version_start"] == 1
    assert answered["metadata"]["call_index"] == aborted["metadata"]["call_index"] + 1
