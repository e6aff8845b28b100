"""Injected faults over real HTTP: error statuses, latency, dropped connections, defective replies."""

from __future__ import annotations

import json
import math
import time

import httpx
import pytest

from openenv_harness.testing.engine import EngineConfig, EngineServer, Fault, Script, Turn


@pytest.mark.parametrize(("status", "kind"), [(400, "BadRequestError"), (500, "InternalServerError"),
                                              (503, "Service Unavailable")])
def test_error_statuses_use_vllm_bodies(engine: EngineServer, wire, status: int, kind: str) -> None:
    engine.add_fault("*", Fault(status=status, message="boom"))
    reply = wire.post_chat(engine, wire.chat_body([wire.USER]))
    assert reply.status_code == status
    assert reply.json() == {"error": {"message": "boom", "type": kind, "param": None, "code": status}}
    assert wire.post_chat(engine, wire.chat_body([wire.USER])).status_code == 200, "count=1 is used up"


def test_429_carries_retry_after_and_401_is_the_auth_middleware_body(engine: EngineServer, wire) -> None:
    engine.add_fault("*", Fault(status=429, retry_after=2.5))
    limited = wire.post_chat(engine, wire.chat_body([wire.USER]))
    assert limited.status_code == 429 and limited.headers["retry-after"] == "2.5"
    assert limited.json()["error"]["type"] == "Too Many Requests"
    engine.add_fault("*", Fault(status=401))
    unauthorized = wire.post_chat(engine, wire.chat_body([wire.USER]))
    assert unauthorized.status_code == 401 and unauthorized.json() == {"error": "Unauthorized"}


def test_count_on_turn_agent_only_and_keys(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[Turn(content="one"), Turn(content="two")]))
    engine.add_fault("sess-a", Fault(status=500, count=2, on_turn=1, agent_only=True))
    headers = {"X-OpenEnv-Harness-Session": "sess-a"}
    turn1 = [wire.USER, {"role": "assistant", "content": "one"}, {"role": "user", "content": "again"}]
    assert wire.post_chat(engine, wire.chat_body(turn1), headers).status_code == 200, "turn 0 is not hit"
    at_turn_1 = [wire.USER, {"role": "assistant", "content": "one"}]
    assert wire.post_chat(engine, {"messages": at_turn_1}, headers).status_code == 200, "aux calls are not hit"
    assert wire.post_chat(engine, wire.chat_body(at_turn_1)).status_code == 200, "other sessions are not hit"
    assert [wire.post_chat(engine, wire.chat_body(at_turn_1), headers).status_code for _ in range(3)] == [500, 500, 200]


def test_fault_attached_to_a_scripted_turn(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[Turn(content="one", fault=Fault(status=503))]))
    assert wire.post_chat(engine, wire.chat_body([wire.USER])).status_code == 503
    assert wire.post_chat(engine, wire.chat_body([wire.USER])).status_code == 200


def test_latency(engine: EngineServer, wire) -> None:
    engine.add_fault("*", Fault(latency_s=0.3))
    started = time.monotonic()
    assert wire.post_chat(engine, wire.chat_body([wire.USER])).status_code == 200
    assert time.monotonic() - started >= 0.3


def test_drop_before_headers(engine: EngineServer, wire) -> None:
    engine.add_fault("*", Fault(drop=True))
    with pytest.raises(httpx.TransportError):
        wire.post_chat(engine, wire.chat_body([wire.USER]))
    assert wire.post_chat(engine, wire.chat_body([wire.USER])).status_code == 200, "the server survives"


def test_drop_mid_stream(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[Turn(content="A reply long enough to be cut in the middle.")]))
    engine.add_fault("*", Fault(drop=True))
    lines: list[str] = []
    with pytest.raises(httpx.TransportError):
        with httpx.stream("POST", engine.url + "/v1/chat/completions",
                          json=wire.chat_body([wire.USER], stream=True), timeout=10) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                lines.append(line)
    data = [line for line in lines if line.startswith("data: ")]
    assert len(data) >= 2 and "data: [DONE]" not in data
    assert all(json.loads(d[6:])["choices"][0]["finish_reason"] is None for d in data)


def test_missing_token_ids(engine: EngineServer, wire) -> None:
    engine.add_fault("*", Fault(missing_token_ids=True, count=2))
    body = wire.post_chat(engine, wire.chat_body([wire.USER])).json()
    assert "prompt_token_ids" not in body and "token_ids" not in body["choices"][0]
    assert body["choices"][0]["logprobs"]["content"]
    events = wire.read_sse(engine, wire.chat_body([wire.USER]))
    assert all("prompt_token_ids" not in e for e in events[:-1])
    assert all("token_ids" not in e["choices"][0] for e in events[:-1] if e["choices"])


def test_missing_token_ids_keep_token_id_strings(wire) -> None:
    from openenv_harness.testing.engine import EngineConfig

    with EngineServer(EngineConfig(return_tokens_as_token_ids=True)) as engine:
        engine.add_fault("*", Fault(missing_token_ids=True))
        body = wire.post_chat(engine, wire.chat_body([wire.USER])).json()
        assert all(c["token"].startswith("token_id:") for c in body["choices"][0]["logprobs"]["content"])


def test_logprob_and_usage_mismatch(engine: EngineServer, wire) -> None:
    engine.add_fault("*", Fault(logprob_mismatch=True, usage_mismatch=True, count=2))
    body = wire.post_chat(engine, wire.chat_body([wire.USER])).json()
    ids = body["choices"][0]["token_ids"]
    assert len(body["choices"][0]["logprobs"]["content"]) == len(ids) - 1
    assert body["usage"]["completion_tokens"] == len(ids) + 1
    events = wire.read_sse(engine, wire.chat_body([wire.USER], stream_options={"include_usage": True}))
    chunks = [e for e in events[1:-1] if e["choices"]]
    assert sum(len(e["choices"][0]["logprobs"]["content"]) for e in chunks) == len(chunks) - 1
    assert events[-2]["usage"]["completion_tokens"] == len(chunks) + 1


def test_nan_logprob_is_a_bare_nan(engine: EngineServer, wire) -> None:
    engine.add_fault("*", Fault(nan_logprob=True))
    raw = wire.post_chat(engine, wire.chat_body([wire.USER])).text
    assert '"logprob":NaN' in raw
    values = [c["logprob"] for c in json.loads(raw)["choices"][0]["logprobs"]["content"]]
    assert sum(math.isnan(v) for v in values) == 1


def test_fault_registration_is_validated(engine: EngineServer) -> None:
    empty = httpx.post(engine.url + "/_ref/faults", json={"key": "*", "fault": {"count": 2}})
    assert empty.status_code == 400 and "at least one effect" in empty.json()["error"]["message"]
    bad_status = httpx.post(engine.url + "/_ref/faults", json={"fault": {"status": 200}})
    assert bad_status.status_code == 400


def test_api_key_and_a_fault_that_quotes_the_request_headers(wire) -> None:
    with EngineServer(EngineConfig(api_key="engine-key-123")) as keyed:
        body = wire.chat_body([wire.USER])
        refused = wire.post_chat(keyed, body)
        assert refused.status_code == 401 and refused.json() == {"error": "Unauthorized"}  # vLLM --api-key
        key = {"authorization": "Bearer engine-key-123"}
        assert wire.post_chat(keyed, body, key).status_code == 200
        keyed.add_fault("*", Fault(status=500, echo_headers=True))
        echoed = wire.post_chat(keyed, body, key)
        assert echoed.status_code == 500 and "Bearer engine-key-123" in echoed.json()["error"]["message"]
        assert httpx.get(keyed.url + "/health", timeout=10).status_code == 200  # only /v1 needs the key
