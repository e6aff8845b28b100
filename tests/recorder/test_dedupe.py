"""Retry de-duplication: a retried call is answered from the record, never sampled twice."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx

from openenv_harness.recorder import RecorderClient, RecorderServer
from openenv_harness.testing.engine import EngineServer, Fault

from agentloop import TOOLS, parse_sse, tool_script

BODY = {"model": "reference-model", "messages": [{"role": "user", "content": "same body"}], "tools": TOOLS,
        "stream": True, "stream_options": {"include_usage": True}}


def post(s: dict, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{s['base_url']}/chat/completions", json=BODY, timeout=30,
                      headers={"authorization": f"Bearer {s['secret']}", **(headers or {})})


def test_identical_retry_is_replayed(engine: EngineServer, recorder: RecorderServer, admin: RecorderClient) -> None:
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(3))
    first = post(s)
    second = post(s, {"x-stainless-retry-count": "1"})
    assert first.status_code == second.status_code == 200
    assert parse_sse(first.content)[0] == parse_sse(second.content)[0]  # same tool call id, same args
    assert len(admin.records(s["session_id"])) == 1
    assert len(engine.requests(s["session_id"])) == 1  # the engine sampled once
    assert admin.session(s["session_id"])["replayed_calls"] == 1


def test_concurrent_twins_share_one_sample(tmp_path, admin: RecorderClient, recorder: RecorderServer) -> None:
    slow = EngineServer().start()
    try:
        from openenv_harness.recorder import RecorderConfig

        with RecorderServer(RecorderConfig(store_path=str(tmp_path / "t.db"), engine_url=slow.url,
                                           admin_token=recorder.admin_token)) as rec, \
                RecorderClient(rec.url, recorder.admin_token) as adm:
            s = adm.create_session()
            slow.set_script(s["session_id"], tool_script(2))
            slow.add_fault(s["session_id"], Fault(latency_s=0.6))
            with ThreadPoolExecutor(4) as pool:
                replies = list(pool.map(lambda _: post(s), range(4)))
            assert {r.status_code for r in replies} == {200}
            assert len({r.content for r in replies}) == 1
            assert len(slow.requests(s["session_id"])) == 1
            assert len(adm.records(s["session_id"])) == 1
    finally:
        slow.stop()


def test_failed_call_retry_gets_a_fresh_attempt(engine: EngineServer, recorder: RecorderServer,
                                               admin: RecorderClient) -> None:
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(1))
    engine.add_fault(s["session_id"], Fault(status=503))
    assert post(s).status_code == 503
    assert post(s).status_code == 200
    assert [r["metadata"]["status"] for r in admin.records(s["session_id"])] == ["failed", "ok"]


def test_different_bodies_are_not_deduplicated(engine: EngineServer, recorder: RecorderServer,
                                              admin: RecorderClient) -> None:
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(3))
    post(s)
    httpx.post(f"{s['base_url']}/chat/completions", json={**BODY, "max_tokens": 100},
               headers={"authorization": f"Bearer {s['secret']}"})
    assert len(admin.records(s["session_id"])) == 2


def test_idempotency_key_names_the_call(engine: EngineServer, recorder: RecorderServer, admin: RecorderClient) -> None:
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(3))
    auth = {"authorization": f"Bearer {s['secret']}", "idempotency-key": "call-42"}
    a = httpx.post(f"{s['base_url']}/chat/completions", json=BODY, headers=auth)
    # same key, body re-encoded differently by the client (key order): still the same logical call
    b = httpx.post(f"{s['base_url']}/chat/completions", headers={**auth, "content-type": "application/json"},
                   content=b'{"tools":' + json.dumps(TOOLS).encode() + b',"model":"reference-model",'
                   b'"messages":[{"role":"user","content":"same body"}],"stream":true,"stream_options":{"include_usage":true}}')
    assert a.status_code == b.status_code == 200 and a.content == b.content
    assert len(admin.records(s["session_id"])) == 1


LOGPROBS_BODY = {"model": "reference-model", "messages": [{"role": "user", "content": "with logprobs"}],
                 "tools": TOOLS, "logprobs": True}


def _logprobs(reply: httpx.Response) -> list:
    assert reply.status_code == 200, reply.text
    content = reply.json()["choices"][0]["logprobs"]["content"]
    assert content and all(isinstance(entry["logprob"], float) for entry in content)
    return content


def test_a_replayed_retry_keeps_the_logprobs_the_agent_asked_for(engine: EngineServer, recorder: RecorderServer,
                                                                 admin: RecorderClient) -> None:
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(3))
    auth = {"authorization": f"Bearer {s['secret']}"}
    first = httpx.post(f"{s['base_url']}/chat/completions", json=LOGPROBS_BODY, headers=auth, timeout=30)
    retry = httpx.post(f"{s['base_url']}/chat/completions", json=LOGPROBS_BODY, headers=auth, timeout=30)
    assert _logprobs(retry) == _logprobs(first) and retry.json() == first.json()  # from the stored record
    assert len(engine.requests(s["session_id"])) == 1 and admin.session(s["session_id"])["replayed_calls"] == 1
    # a call that did not ask for them gets none, replayed or not
    plain = {k: v for k, v in LOGPROBS_BODY.items() if k != "logprobs"}
    a = httpx.post(f"{s['base_url']}/chat/completions", json=plain, headers=auth, timeout=30)
    b = httpx.post(f"{s['base_url']}/chat/completions", json=plain, headers=auth, timeout=30)
    assert a.json() == b.json() and "logprobs" not in a.json()["choices"][0]
    # the record's evidence is the same either way: the logprobs are also the record's per_token_logps
    records = admin.records(s["session_id"])
    assert [e["logprob"] for e in _logprobs(first)] == records[0]["per_token_logps"]


def test_concurrent_twins_keep_the_logprobs_the_agent_asked_for(tmp_path, recorder: RecorderServer) -> None:
    from openenv_harness.recorder import RecorderConfig

    slow = EngineServer().start()
    try:
        with RecorderServer(RecorderConfig(store_path=str(tmp_path / "t.db"), engine_url=slow.url,
                                           admin_token=recorder.admin_token)) as rec, \
                RecorderClient(rec.url, recorder.admin_token) as adm:
            s = adm.create_session()
            slow.set_script(s["session_id"], tool_script(2))
            slow.add_fault(s["session_id"], Fault(latency_s=0.6))
            auth = {"authorization": f"Bearer {s['secret']}"}
            with ThreadPoolExecutor(3) as pool:
                replies = list(pool.map(lambda _: httpx.post(f"{s['base_url']}/chat/completions",
                                                             json=LOGPROBS_BODY, headers=auth, timeout=30), range(3)))
            assert len(slow.requests(s["session_id"])) == 1
            assert len({r.content for r in replies}) == 1 and _logprobs(replies[0])
    finally:
        slow.stop()


def test_a_retry_across_a_restart_is_answered_from_the_record(tmp_path, engine: EngineServer) -> None:
    """The recorder restarts between a call and the agent's retry of it: the retry is still answered
    with what the first attempt was sent, and the engine is not asked again (``session/restore.py``)."""
    from openenv_harness.recorder import RecorderConfig

    config = RecorderConfig(store_path=str(tmp_path / "restart.db"), engine_url=engine.url, admin_token="a" * 32)
    with RecorderServer(config) as first, RecorderClient(first.url, "a" * 32) as adm:
        s = adm.create_session()
        engine.set_script(s["session_id"], tool_script(3))
        before = post({**s, "base_url": f"{first.url}/rollout/{s['session_id']}/v1"})
    with RecorderServer(config) as second, RecorderClient(second.url, "a" * 32) as adm:
        retry = post({**s, "base_url": f"{second.url}/rollout/{s['session_id']}/v1"},
                     {"x-stainless-retry-count": "1"})
        assert before.status_code == retry.status_code == 200
        assert parse_sse(before.content)[0] == parse_sse(retry.content)[0]
        assert len(adm.records(s["session_id"])) == 1 and len(engine.requests(s["session_id"])) == 1
        assert adm.session(s["session_id"])["replayed_calls"] == 1
