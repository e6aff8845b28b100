"""Engine failures (D14): each surfaces to the agent as a clear, correctly-retryable HTTP error,
is kept on the session and in a failed-call record; bad evidence is recorded as untrainable."""

from __future__ import annotations

import httpx
import pytest
from openenv.core.harness import TrainingTrace

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineServer, Fault

from agentloop import ADMIN, tool_script

BODY = {"model": "reference-model", "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]}


def call(s: dict, stream: bool = False, timeout: float = 30) -> httpx.Response:
    body = {**BODY, "stream": stream}
    return httpx.post(f"{s['base_url']}/chat/completions", json=body,
                      headers={"authorization": f"Bearer {s['secret']}"}, timeout=timeout)


@pytest.mark.parametrize(
    "fault, status, retry_after",
    [
        (Fault(status=429, retry_after=3), 429, "3"),
        (Fault(status=500), 500, None),
        (Fault(status=503, retry_after=1), 503, "1"),
        (Fault(status=400, message="bad request from engine"), 400, None),
        (Fault(status=401), 401, None),
        (Fault(drop=True), 502, "2"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_status_faults(fault: Fault, status: int, retry_after: str | None, stream: bool, engine: EngineServer,
                       recorder: RecorderServer, admin: RecorderClient) -> None:
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(0))
    engine.add_fault(s["session_id"], fault)
    r = call(s, stream=stream)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")  # an HTTP error, never a broken stream
    assert r.json()["error"]["message"]
    assert r.headers.get("retry-after") == retry_after
    info = admin.session(s["session_id"])
    assert info["failed_calls"] == 1 and info["last_error"]["status"] == status
    rec = admin.records(s["session_id"])[0]
    assert rec["metadata"]["status"] == "failed" and rec["metadata"]["error"]["status"] == status
    if fault.status:
        assert rec["metadata"]["error"]["upstream_status"] == fault.status
        assert rec["metadata"]["error"]["upstream_body"] is not None  # the engine's original error, kept
    # the fault was one-shot: the retry succeeds and is a normal record
    assert call(s, stream=stream).status_code == 200
    statuses = [r["metadata"]["status"] for r in admin.records(s["session_id"])]
    assert statuses == ["failed", "ok"]
    assert [t.node_id for t in TrainingTrace.model_validate(admin.training_trace_json(s["session_id"])).turns] == [
        f"{s['session_id']}/1"]


def test_engine_timeout_is_504_and_unreachable_engine_is_502(tmp_path, engine: EngineServer) -> None:
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN,
                            upstream_timeout_s=0.5)
    with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as admin:
        s = admin.create_session()
        engine.set_script(s["session_id"], tool_script(0))
        engine.add_fault(s["session_id"], Fault(latency_s=2.0))
        r = call(s)
        assert r.status_code == 504 and r.json()["error"]["code"] == "engine_timeout"
    dead = RecorderConfig(store_path=str(tmp_path / "d.db"), engine_url="http://127.0.0.1:9", admin_token=ADMIN)
    with RecorderServer(dead) as server, RecorderClient(server.url, ADMIN) as admin:
        s = admin.create_session()
        r = call(s)
        assert r.status_code == 502 and r.json()["error"]["code"] == "engine_connect"
        assert admin.records(s["session_id"])[0]["metadata"]["error"]["kind"] == "engine_connect"


@pytest.mark.parametrize(
    "fault, reason",
    [
        (Fault(missing_token_ids=True), "engine returned no prompt_token_ids"),
        (Fault(logprob_mismatch=True), "logprobs"),
        (Fault(usage_mismatch=True), "usage.completion_tokens"),
        (Fault(nan_logprob=True), "a logprob is not finite"),
    ],
)
def test_bad_evidence_is_recorded_untrainable(fault: Fault, reason: str, engine: EngineServer, recorder: RecorderServer,
                                              admin: RecorderClient) -> None:
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(0))
    engine.add_fault(s["session_id"], fault)
    r = call(s)
    assert r.status_code == 200  # the agent still gets its answer
    rec = admin.records(s["session_id"])[0]
    md = rec["metadata"]
    assert md["status"] == "invalid" and md["trainable"] is False
    assert any(reason in x for x in md["invalid_reasons"]), md["invalid_reasons"]
    assert set(rec["loss_mask"]) <= {0}
    assert admin.training_trace_json(s["session_id"])["turns"] == []  # never handed to a trainer
    assert admin.session(s["session_id"])["invalid_calls"] == 1
