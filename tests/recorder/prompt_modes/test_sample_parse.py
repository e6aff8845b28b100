"""A continued call's sample parsed in generate's own reply (vLLM 0.33's ``output_mode="derender"``)
or, where the engine has no such thing, through derender: the same records and replies either way."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineConfig, EngineServer, Fault

from agentloop import ADMIN, TOOLS, run_agent, tool_script

GENERATE, DERENDER = "/inference/v1/generate", "/v1/chat/completions/derender"


@contextmanager
def _stack(tmp_path: Path, name: str, **engine: object) -> Iterator[tuple[EngineServer, RecorderClient]]:
    with EngineServer(EngineConfig(**engine)) as eng, RecorderServer(RecorderConfig(  # type: ignore[arg-type]
            store_path=str(tmp_path / f"{name}.db"), engine_url=eng.url, admin_token=ADMIN)) as rec, \
            RecorderClient(rec.url, ADMIN) as admin:
        yield eng, admin


def _rollout(engine: EngineServer, admin: RecorderClient, *, stream: bool, **session: object) -> tuple[str, list[dict]]:
    s = admin.create_session(prompt_mode="incremental", prompt_mode_strict=True, **session)
    engine.set_script(s["session_id"], tool_script(3, spaced_args=True))
    run_agent(s["base_url"], s["secret"], stream=stream, echo="pi")
    return s["session_id"], admin.records(s["session_id"])


def _reply(record: dict) -> dict:
    """What the agent was answered, without what differs on every answer (ids, times)."""
    choice = record["response"]["choices"][0]
    message = dict(choice["message"])
    message["tool_calls"] = [{k: v for k, v in c.items() if k != "id"} for c in message.get("tool_calls") or []]
    return {"message": message, "finish_reason": choice["finish_reason"], "token_ids": choice.get("token_ids"),
            "logprobs": choice.get("logprobs")}


def test_one_step_parse_records_and_answers_what_two_steps_do(tmp_path: Path) -> None:
    runs = {}
    for one_step in (True, False):
        with _stack(tmp_path, str(one_step), generate_derender=one_step) as (engine, admin):
            session, records = _rollout(engine, admin, stream=False)
            log = engine.requests(session)
            runs[one_step] = (records, [e for e in log if e["path"] in (GENERATE, DERENDER)],
                              [e["sampled"] for e in log if "sampled" in e])
    (one, one_log, one_sampled), (two, two_log, two_sampled) = runs[True], runs[False]
    assert [r["metadata"]["fidelity"]["class"] for r in one] == ["root"] + ["exact"] * 3
    modes = [r["metadata"]["prompt_mode"] for r in one[1:]]
    assert all(m["continued"] and m["parsed_via"] == GENERATE for m in modes)
    assert all(m["parsed_via"] == DERENDER for m in (r["metadata"]["prompt_mode"] for r in two[1:]))
    # one exchange fewer per continued call: generate parses, derender is never asked
    assert [e["path"] for e in one_log] == [GENERATE] * 3
    assert all(e["body"]["output_mode"] == "derender" and e["body"]["parse_context"]["tools"] for e in one_log)
    assert [e["path"] for e in two_log] == [GENERATE, DERENDER] * 3
    # the same evidence and the same replies (a sample's logprobs are drawn per session, so each run's
    # are checked against what its engine sampled)
    for field in ("prompt_token_ids", "completion_token_ids", "loss_mask"):
        assert [r[field] for r in one] == [r[field] for r in two], field
    assert [_reply(r) for r in one] == [_reply(r) for r in two]
    for records, sampled in ((one, one_sampled), (two, two_sampled)):
        assert [r["per_token_logps"] for r in records] == [s["logprobs"] for s in sampled]
        assert [r["completion_token_ids"] for r in records] == [s["token_ids"] for s in sampled]
    assert one[-1]["response"]["choices"][0]["message"]["content"] == "All done."


def test_one_step_parse_streams_to_an_agent_that_streams(tmp_path: Path) -> None:
    with _stack(tmp_path, "s", generate_derender=True) as (engine, admin):
        _, records = _rollout(engine, admin, stream=True)
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root"] + ["exact"] * 3
    assert all(r["metadata"]["prompt_mode"]["parsed_via"] == GENERATE for r in records[1:])
    assert records[-1]["response"]["choices"][0]["message"]["content"] == "All done."


def test_an_engine_that_refuses_the_one_step_parse_is_asked_in_two_from_then_on(tmp_path: Path) -> None:
    """A render server newer than its generate server (behind one router): generate's 400 about
    ``output_mode`` sampled nothing, so the call is sampled again in two steps, and so are later ones."""
    with _stack(tmp_path, "r", generate_derender=True) as (engine, admin):
        s = admin.create_session(prompt_mode="incremental", prompt_mode_strict=True)
        engine.set_script(s["session_id"], tool_script(3, spaced_args=True))
        engine.add_fault(s["session_id"], Fault(status=400, on_turn=1,
                                                message="output_mode: Input should be 'tokens' or 'text'"))
        run_agent(s["base_url"], s["secret"], stream=False, echo="pi")
        records = admin.records(s["session_id"])
        paths = [(e["path"], (e.get("body") or {}).get("output_mode")) for e in engine.requests(s["session_id"])
                 if e["path"] in (GENERATE, DERENDER)]
    assert [r["metadata"]["status"] for r in records] == ["ok"] * 4
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root"] + ["exact"] * 3
    assert [r["metadata"]["prompt_mode"]["parsed_via"] for r in records[1:]] == [DERENDER] * 3
    assert paths == [(GENERATE, "derender"), (GENERATE, None), (DERENDER, None)] + [(GENERATE, None), (DERENDER, None)] * 2


def _two_calls(s: dict, **body: object) -> tuple[httpx.Response, httpx.Response]:
    """A chain's start and the call that continues it (its tool call answered)."""
    def post(messages: list[dict[str, Any]]) -> httpx.Response:
        return httpx.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                          json={"model": "reference-model", "messages": messages, "tools": TOOLS, "max_tokens": 256,
                                **body}, timeout=60)
    user = {"role": "user", "content": "go"}
    first = post([user])
    message = first.json()["choices"][0]["message"]
    call = message["tool_calls"][0]
    return first, post([user, {"role": "assistant", "content": message["content"], "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": call["id"], "content": "ok"}])


def test_an_engine_error_in_the_one_step_parse_reaches_the_agent_and_is_recorded(tmp_path: Path) -> None:
    with _stack(tmp_path, "e", generate_derender=True) as (engine, admin):
        s = admin.create_session(prompt_mode="incremental")
        engine.set_script(s["session_id"], tool_script(2))
        engine.add_fault(s["session_id"], Fault(status=500, on_turn=1))
        _, second = _two_calls(s)
        records = admin.records(s["session_id"])
    assert second.status_code == 500 and second.json()["error"]["message"]
    assert [r["metadata"]["status"] for r in records] == ["ok", "failed"]
    assert records[1]["metadata"]["error"]["upstream_status"] == 500
    assert records[1]["metadata"]["prompt_mode"]["failed_at"] == GENERATE


def test_hidden_reasoning_is_parsed_in_two_steps(tmp_path: Path) -> None:
    """``include_reasoning: false`` makes vLLM's one-step reply drop the sampled ids: never asked for."""
    with _stack(tmp_path, "h", generate_derender=True) as (engine, admin):
        s = admin.create_session(prompt_mode="incremental", prompt_mode_strict=True)
        engine.set_script(s["session_id"], tool_script(2))
        first, second = _two_calls(s, include_reasoning=False)
        records = admin.records(s["session_id"])
    assert first.status_code == second.status_code == 200
    assert records[1]["metadata"]["prompt_mode"]["continued"] is True
    assert records[1]["metadata"]["prompt_mode"]["parsed_via"] == DERENDER
    assert records[1]["completion_token_ids"]


def test_a_one_step_reply_without_the_sample_or_the_message_is_an_engine_error() -> None:
    """Nothing can be recorded from it: a 502 the forward step relays and records, never a guessed reply."""
    from openenv_harness.recorder.prompt_modes.sample_parse import _compose_one_step

    whole = {"output_mode": "derender", "request_id": "r", "usage": {},
             "choices": [{"index": 0, "token_ids": [5, 6], "finish_reason": "stop",
                          "message": {"role": "assistant", "content": "hi"}, "logprobs": None}]}
    ok = _compose_one_step(whole, [1, 2, 3])
    assert ok.status == 200 and ok.json is not None
    assert ok.json["choices"][0]["token_ids"] == [5, 6] and ok.json["prompt_token_ids"] == [1, 2, 3]
    assert ok.json["usage"]["completion_tokens"] == 2 and ok.json["choices"][0]["message"]["content"] == "hi"
    for missing in ("token_ids", "message"):
        choice = {k: v for k, v in whole["choices"][0].items() if k != missing}
        bad = _compose_one_step({**whole, "choices": [choice]}, [1, 2, 3])
        assert bad.status == 502 and bad.json is None, missing


@pytest.mark.parametrize("one_step", [False, True], ids=["two_steps", "one_step"])
def test_an_abort_before_the_first_token_is_retried_as_in_full_history(tmp_path: Path, one_step: bool) -> None:
    """A pause in abort mode while the continued call is still in prefill: generate answers no ids,
    which vLLM's derender would refuse with a 400 the agent cannot act on. The recorder asks nothing
    more: the call is recorded as an abort (partial, untrainable) and the agent is told to retry (503),
    as in full history; the retry continues the chain."""
    with _stack(tmp_path, "a", generate_derender=one_step, prefill_delay_s=1.5) as (engine, admin):
        s = admin.create_session(prompt_mode="incremental", prompt_mode_strict=True)
        engine.set_script(s["session_id"], tool_script(2))
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(_two_calls, s)
            deadline = time.monotonic() + 30
            while not any(e["path"] == GENERATE for e in engine.requests(s["session_id"])):
                assert time.monotonic() < deadline and not pending.done(), "the continued call never reached generate"
                time.sleep(0.02)
            engine.pause("abort")
            engine.resume()
            first, aborted = pending.result(timeout=60)
        retried = httpx.post(str(aborted.request.url), headers=dict(aborted.request.headers),
                             content=aborted.request.content, timeout=60)
        records = admin.records(s["session_id"])
        paths = [e["path"] for e in engine.requests(s["session_id"]) if e["path"] in (GENERATE, DERENDER)]
    assert first.status_code == 200
    assert aborted.status_code == 503 and aborted.json()["error"]["code"] == "engine_aborted"
    assert retried.status_code == 200 and retried.json()["choices"][0]["message"]["tool_calls"]
    assert [r["metadata"]["status"] for r in records] == ["ok", "invalid", "ok"]
    md = records[1]["metadata"]
    assert (md["partial"], md["trainable"], md["finish_reason"]) == (True, False, "abort")
    assert records[1]["completion_token_ids"] == []
    assert md["prompt_mode"]["continued"] is True and md["prompt_mode"]["parsed_via"] == "nothing_sampled"
    assert records[2]["metadata"]["prompt_mode"]["continued"] is True
    assert records[2]["metadata"]["fidelity"]["class"] == "exact"
    # derender was never asked for the empty sample (it would refuse it); the retry parsed as usual
    assert paths == ([GENERATE, GENERATE] if one_step else [GENERATE, GENERATE, DERENDER])


def test_derender_refuses_a_sample_of_no_ids_as_vllm_does(tmp_path: Path) -> None:
    with EngineServer(EngineConfig()) as engine:
        reply = httpx.post(engine.url + DERENDER, json={
            "generate_response": {"choices": [{"index": 0, "token_ids": [], "finish_reason": "abort"}]},
            "chat_request": {"model": "reference-model", "messages": []}}, timeout=30)
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == "choice 0 has empty or null token_ids"
