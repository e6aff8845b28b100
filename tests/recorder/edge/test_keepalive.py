"""A streaming call still with the engine after the grace is kept alive with its API's keepalive event,
and still ends with the reply built after the durable record -- or with an in-stream error event."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig
from openenv_harness.recorder.app import create_recorder_app
from openenv_harness.recorder.serving import ThreadedServer
from openenv_harness.testing.engine import EngineServer, Fault, Script, Turn

from agentloop import ADMIN

SLOW = 2.0  # the engine's latency in the slow cases: far beyond the grace, whatever the machine's load
GRACE = 0.25


@pytest.fixture(params=["fast path", "asgi"])
def served(request, tmp_path: Path, engine: EngineServer) -> Iterator[tuple[ThreadedServer, RecorderClient]]:
    """A recorder with a short keepalive grace, served by the recorder's own chat protocol or by uvicorn's h11
    through ASGI: both paths must carry the keepalives."""
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN,
                            stream_keepalive_s=GRACE)
    server = ThreadedServer(create_recorder_app(config), http="h11" if request.param == "asgi" else None).start()
    admin = RecorderClient(server.url, ADMIN)
    try:
        yield server, admin
    finally:
        admin.close()
        server.stop()


def _session(engine: EngineServer, admin: RecorderClient, name: str, *, latency: float = 0.0,
             status: int | None = None) -> tuple[dict, str]:
    s = admin.create_session()
    engine.set_script(s["session_id"], Script(turns=[Turn(content=f"answer from {name}")]))
    if latency or status:
        engine.add_fault(s["session_id"], Fault(latency_s=latency, status=status))
    return s, f"{admin.base_url}/rollout/{s['session_id']}/v1"


def _frames(body: bytes) -> list[str]:
    return [f for f in body.decode().split("\n\n") if f.strip()]


CHAT = {"model": "reference-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def test_a_slow_chat_stream_gets_keepalives_then_the_reply_the_sdk_reads(served, engine: EngineServer) -> None:
    server, admin = served
    s, base = _session(engine, admin, "slow chat", latency=SLOW)
    r = httpx.post(base + "/chat/completions", json=CHAT, headers={"authorization": f"Bearer {s['secret']}"},
                   timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    frames = _frames(r.content)
    pings = [f for f in frames if f == ": keepalive"]
    assert pings and frames[:len(pings)] == pings  # keepalives first, while the engine works
    data = [json.loads(f[len("data: "):]) for f in frames[len(pings):] if f != "data: [DONE]"]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in data if c["choices"])
    assert frames[-1] == "data: [DONE]"
    assert streamed and streamed == admin.records(s["session_id"])[0]["response"]["choices"][0]["message"]["content"]
    # OpenAI's own client reads the same stream (it skips the comments)
    s2, base2 = _session(engine, admin, "sdk", latency=SLOW)
    client = openai.OpenAI(base_url=base2, api_key=s2["secret"], max_retries=0)
    chunks = list(client.chat.completions.create(model="reference-model", messages=CHAT["messages"], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == streamed  # the same scripted turn
    assert [r["metadata"]["status"] for r in admin.records(s["session_id"]) + admin.records(s2["session_id"])] \
        == ["ok", "ok"]


def test_an_engine_error_after_the_keepalives_ends_the_stream_as_the_api_does(served, engine: EngineServer) -> None:
    server, admin = served
    s, base = _session(engine, admin, "failing", latency=SLOW, status=500)
    r = httpx.post(base + "/chat/completions", json=CHAT, headers={"authorization": f"Bearer {s['secret']}"},
                   timeout=60)
    assert r.status_code == 200  # committed by the keepalives before the engine failed
    frames = _frames(r.content)
    assert frames[0] == ": keepalive" and frames[-1].startswith("data: ")
    error = json.loads(frames[-1][len("data: "):])["error"]
    assert error["message"] and error["type"]
    client = openai.OpenAI(base_url=base, api_key=s["secret"], max_retries=0)
    engine.add_fault(s["session_id"], Fault(latency_s=SLOW, status=500))
    with pytest.raises(openai.APIError):
        list(client.chat.completions.create(model="reference-model", stream=True,
                                            messages=[{"role": "user", "content": "hi again"}]))
    records = admin.records(s["session_id"])
    assert records and all(r["metadata"]["status"] == "failed" and not r["metadata"]["trainable"] for r in records)


def test_a_slow_anthropic_stream_pings_and_ends_with_its_own_events(served, engine: EngineServer) -> None:
    server, admin = served
    s, base = _session(engine, admin, "slow messages", latency=SLOW)
    body = {"model": "policy", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "Bash", "input_schema": {"type": "object", "properties": {}}}]}
    headers = {"x-api-key": s["secret"], "anthropic-version": "2023-06-01"}
    r = httpx.post(base + "/messages", json=body, headers=headers, timeout=60)
    assert r.status_code == 200
    events = [f.split("\n")[0] for f in _frames(r.content)]
    pings = events.count("event: ping")
    assert pings and events[:pings] == ["event: ping"] * pings
    assert events[pings] == "event: message_start" and events[-1] == "event: message_stop"
    # an error after the pings: Anthropic's in-stream error event, in its error shape
    engine.add_fault(s["session_id"], Fault(latency_s=SLOW, status=503))
    again = {**body, "messages": [{"role": "user", "content": "hi again"}]}  # not a retry: no replay
    failed = httpx.post(base + "/messages", json=again, headers=headers, timeout=60)
    last = _frames(failed.content)[-1].split("\n")
    assert failed.status_code == 200 and last[0] == "event: error"
    payload = json.loads(last[1][len("data: "):])
    assert payload["type"] == "error" and payload["error"]["type"] and payload["error"]["message"]


def test_a_slow_responses_stream_keeps_alive_and_fails_as_response_failed(served, engine: EngineServer) -> None:
    server, admin = served
    s, base = _session(engine, admin, "slow responses", latency=SLOW)
    body = {"model": "policy", "stream": True, "input": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}}]}
    headers = {"authorization": f"Bearer {s['secret']}"}
    r = httpx.post(base + "/responses", json=body, headers=headers, timeout=60)
    frames = _frames(r.content)
    assert r.status_code == 200 and frames[0] == ": keepalive"
    kinds = [f.split("\n")[0] for f in frames if not f.startswith(":")]
    assert kinds[0] == "event: response.created" and kinds[-1] == "event: response.completed"
    engine.add_fault(s["session_id"], Fault(latency_s=SLOW, status=500))
    again = {**body, "input": [{"role": "user", "content": "hi again"}]}  # not a retry: no replay
    failed = httpx.post(base + "/responses", json=again, headers=headers, timeout=60)
    last = _frames(failed.content)[-1].split("\n")
    assert last[0] == "event: response.failed"
    response = json.loads(last[1][len("data: "):])["response"]
    assert response["status"] == "failed" and response["error"]["message"]


def test_fast_and_non_streaming_calls_are_answered_as_before(served, engine: EngineServer) -> None:
    server, admin = served
    s, base = _session(engine, admin, "slow json", latency=SLOW)
    headers = {"authorization": f"Bearer {s['secret']}"}
    plain = httpx.post(base + "/chat/completions", json={**CHAT, "stream": False}, headers=headers, timeout=60)
    assert plain.status_code == 200 and plain.headers["content-type"] == "application/json"  # no keepalive in JSON
    assert plain.json()["choices"][0]["message"]["content"]
    # a refusal inside the grace keeps its status (no stream was committed)
    wrong = httpx.post(base + "/chat/completions", json=CHAT, headers={"authorization": "Bearer nope"}, timeout=60)
    assert wrong.status_code == 401
    # keepalives off: a slow stream is answered in one piece, with its length
    off = RecorderConfig(store_path=str(Path(server.app.state.ctx.config.store_path).with_suffix(".off.db")),
                         engine_url=engine.url, admin_token=ADMIN, stream_keepalive_s=0)
    with ThreadedServer(create_recorder_app(off)) as other, RecorderClient(other.url, ADMIN) as admin2:
        s2, base2 = _session(engine, admin2, "no keepalive", latency=0.5)
        r = httpx.post(base2 + "/chat/completions", json=CHAT, headers={"authorization": f"Bearer {s2['secret']}"},
                       timeout=60)
        assert r.status_code == 200 and "content-length" in r.headers and b": keepalive" not in r.content
