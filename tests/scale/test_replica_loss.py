"""A replica lost mid-rollout, behind the real vllm-router: the calls of the sessions it served fail
with a retryable error that names it, recorded with the cause; the other replica's sessions go
on; once the router stops sending to the dead replica (its circuit breaker), the session's retry
is served by another replica."""

from __future__ import annotations

from pathlib import Path

import httpx

from openenv_harness.engine.router import VLLMRouter
from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineServer

from agentloop import ADMIN, TOOLS, tool_script
from replica_keys import key_for_each


def _chat(s: dict, text: str) -> httpx.Response:
    return httpx.post(f"{s['base_url']}/chat/completions", timeout=60, headers={"authorization": f"Bearer {s['secret']}"},
                      json={"model": "reference-model", "messages": [{"role": "user", "content": text}], "tools": TOOLS})


def test_a_lost_replica_fails_its_sessions_calls_clearly_and_the_others_go_on(tmp_path: Path) -> None:
    engines = [EngineServer().start() for _ in range(2)]
    try:
        with VLLMRouter([e.url for e in engines], log_path=tmp_path / "router.log") as router, \
                RecorderServer(RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=router.url,
                                              admin_token=ADMIN)) as recorder, \
                RecorderClient(recorder.url, ADMIN) as admin:
            lost_key, kept_key = key_for_each(router, engines)
            lost, kept = admin.create_session(affinity_key=lost_key), admin.create_session(affinity_key=kept_key)
            for s in (lost, kept):
                for engine in engines:
                    engine.set_script(s["session_id"], tool_script(0, final="ok"))
            assert _chat(lost, "first").status_code == 200 and _chat(kept, "first").status_code == 200
            dead = engines[0].url
            engines[0].stop()  # the lost session's replica goes away between its turns

            failed = _chat(lost, "second")
            assert failed.status_code >= 500  # retryable for the agent's SDK
            assert dead in failed.json()["error"]["message"]  # the router's error names the replica
            record = admin.records(lost["session_id"])[-1]
            md = record["metadata"]
            assert md["status"] == "failed" and md["trainable"] is False
            assert md["error"]["upstream_status"] == failed.status_code and dead in md["error"]["message"]

            assert _chat(kept, "second").status_code == 200  # the other replica's session is unaffected
            # the agent retries; the router's circuit breaker soon sends the key elsewhere
            for _ in range(10):
                retried = _chat(lost, "second")
                if retried.status_code == 200:
                    break
            assert retried.status_code == 200, retried.text
            assert [e["session"] for e in engines[1].requests() if e["session"] == lost["session_id"]]
            assert admin.records(lost["session_id"])[-1]["metadata"]["status"] == "ok"
    finally:
        for engine in engines:
            engine.stop()
