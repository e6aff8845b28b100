"""The weight-sync fence (D12): pause/resume through the recorder, policy versions on every record,
calls straddling a sync flagged, calls during a pause held (bounded) then 503 + Retry-After."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineConfig, EngineServer

from agentloop import ADMIN, TOOLS, tool_script


@pytest.fixture
def slow_stack(tmp_path: Path):
    engine = EngineServer(EngineConfig(decode_delay_s=0.03)).start()
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN,
                            pause_wait_s=0.5, retry_after_s=3)
    server = RecorderServer(config).start()
    client = RecorderClient(server.url, ADMIN)
    yield engine, server, client
    client.close()
    server.stop()
    engine.stop()


def chat(s: dict, text: str) -> httpx.Response:
    return httpx.post(f"{s['base_url']}/chat/completions", timeout=60, headers={"authorization": f"Bearer {s['secret']}"},
                      json={"model": "reference-model", "messages": [{"role": "user", "content": text}], "tools": TOOLS})


def test_keep_mode_pause_straddles_and_is_flagged(slow_stack) -> None:
    engine, server, admin = slow_stack
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(0, final="a long enough answer to take a while to decode " * 2))
    result: dict = {}
    t = threading.Thread(target=lambda: result.setdefault("r", chat(s, "straddle")))
    t.start()
    time.sleep(0.3)  # the call is decoding on the engine
    state = admin.pause_engine("keep")
    assert state["paused"] is True and engine.is_paused()
    time.sleep(0.4)
    assert t.is_alive()  # keep mode: the in-flight call is frozen, not failed
    resumed = admin.resume_engine()
    assert resumed["policy_version"] == 1 and not resumed["paused"]
    t.join(30)
    assert result["r"].status_code == 200  # never a torn generation
    md = admin.records(s["session_id"])[0]["metadata"]
    assert (md["policy_version_start"], md["policy_version_end"], md["straddled_sync"]) == (0, 1, True)
    # a call after the sync is served by version 1 alone
    chat(s, "after")
    md2 = admin.records(s["session_id"])[1]["metadata"]
    assert (md2["policy_version_start"], md2["policy_version_end"], md2["straddled_sync"]) == (1, 1, False)
    assert "oeh_straddled_sync_total 1.0" in admin.metrics_text()


def test_calls_during_a_pause_wait_then_get_503(slow_stack) -> None:
    engine, server, admin = slow_stack
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(0, final="ok"))
    admin.pause_engine("keep")
    started = time.monotonic()
    r = chat(s, "blocked")
    waited = time.monotonic() - started
    assert r.status_code == 503 and r.headers["retry-after"] == "3"
    assert r.json()["error"]["code"] == "engine_paused" and waited >= 0.45
    assert admin.records(s["session_id"]) == []  # never reached the engine
    # a call that arrives during the pause and sees the resume in time is served
    t = threading.Thread(target=lambda: time.sleep(0.2) or admin.resume_engine())
    t.start()
    assert chat(s, "held").status_code == 200
    t.join()
    assert admin.records(s["session_id"])[0]["metadata"]["policy_version_start"] == 1


def test_external_fence_and_explicit_version(slow_stack) -> None:
    engine, server, admin = slow_stack
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(0, final="ok"))
    admin.set_policy_version(7)
    chat(s, "v7")
    h = {"authorization": f"Bearer {ADMIN}"}
    assert httpx.post(server.url + "/admin/fence/pause", headers=h).json()["paused"] is True
    assert not engine.is_paused()  # the trainer fences the engine itself; the recorder only holds calls
    assert chat(s, "held").status_code == 503
    assert httpx.post(server.url + "/admin/fence/resume", headers=h).json()["policy_version"] == 8
    chat(s, "v8")
    versions = [r["metadata"]["policy_version_start"] for r in admin.records(s["session_id"])]
    assert versions == [7, 8]


def test_lora_sync_serves_the_published_adapter_name(slow_stack) -> None:
    engine, server, admin = slow_stack
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(0, final="ok"))
    h = {"authorization": f"Bearer {ADMIN}"}
    state = httpx.post(server.url + "/admin/policy_version", headers=h, json={"version": 3, "model": "policy-v3"}).json()
    assert state["served_model"] == "policy-v3"
    chat(s, "lora")
    assert engine.requests(s["session_id"])[-1]["body"]["model"] == "policy-v3"
    rec = admin.records(s["session_id"])[-1]
    assert rec["request"]["model"] == "reference-model"  # what the agent asked for stays in the record
    assert rec["metadata"]["provenance"]["model"] == "policy-v3"  # what served it is provenance
    assert rec["metadata"]["policy_version_start"] == 3
