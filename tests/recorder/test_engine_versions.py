"""The recorder against each vLLM release's semantics (the reference engine's ``vllm_version``): 0.32,
what the real-engine tier runs, and 0.33 / 0.34, what GPU users run. Per release: rollouts in both
prompt modes, weight-version spans on every route that gives them (across a sync through the fence), an
engine paused by someone else, and an empty tools array."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineConfig, EngineServer

from agentloop import ADMIN, run_agent, tool_script

VERSIONS = ["0.32", "0.33", "0.34"]
GENERATE = "/inference/v1/generate"


@contextmanager
def _stack(tmp_path: Path, version: str) -> Iterator[tuple[EngineServer, RecorderClient]]:
    with EngineServer(EngineConfig(vllm_version=version)) as eng, RecorderServer(RecorderConfig(  # type: ignore[arg-type]
            store_path=str(tmp_path / f"{version}.db"), engine_url=eng.url, admin_token=ADMIN)) as rec, \
            RecorderClient(rec.url, ADMIN) as admin:
        yield eng, admin


def _spans(record: dict) -> list[dict] | None:
    return record["metadata"].get("weight_versions")


@pytest.mark.parametrize("version", VERSIONS)
def test_rollouts_in_both_modes_record_the_weight_spans_each_release_gives(tmp_path: Path, version: str) -> None:
    with _stack(tmp_path, version) as (engine, admin):
        runs = {}
        for mode in ("full_history", "incremental"):
            s = admin.create_session(prompt_mode=mode, prompt_mode_strict=mode == "incremental")
            engine.set_script(s["session_id"], tool_script(2))
            run_agent(s["base_url"], s["secret"], stream=False, echo="pi")
            runs[mode] = admin.records(s["session_id"])
        assert engine.info()["version"] == f"{version}.0+reference"
    full, incremental = runs["full_history"], runs["incremental"]
    assert [r["metadata"]["fidelity"]["class"] for r in incremental] == ["root", "exact", "exact"]
    assert all(r["metadata"]["prompt_mode"]["continued"] for r in incremental[1:])
    parsed_via = {r["metadata"]["prompt_mode"]["parsed_via"] for r in incremental[1:]}
    assert parsed_via == ({GENERATE} if version != "0.32" else {"/v1/chat/completions/derender"})
    whole = lambda r: [{"version": "default", "start": 0, "end": len(r["completion_token_ids"])}]  # noqa: E731
    # the chat route answers spans from 0.33 (asked for on every call), generate on every release
    for record in full + incremental[:1]:
        assert _spans(record) == (None if version == "0.32" else whole(record)), record["metadata"]
    for record in incremental[1:]:
        assert _spans(record) == whole(record)


@pytest.mark.parametrize("version", ["0.33", "0.34"])
def test_spans_name_the_weights_after_a_sync_through_the_fence(tmp_path: Path, version: str) -> None:
    with _stack(tmp_path, version) as (engine, admin):
        s = admin.create_session()
        # two different calls (a byte-identical one would be answered from the first one's record)
        chat = lambda text: httpx.post(f"{s['base_url']}/chat/completions", timeout=60,  # noqa: E731
                                       headers={"authorization": f"Bearer {s['secret']}"},
                                       json={"model": "reference-model", "messages": [{"role": "user", "content": text}]})
        assert chat("hi").status_code == 200
        admin.pause_engine("wait")
        httpx.post(f"{engine.url}/update_weight_version", json={"new_version": "step-1"}).raise_for_status()
        admin.resume_engine()
        assert chat("hi again").status_code == 200
        first, second = admin.records(s["session_id"])
    assert [r["metadata"]["policy_version_start"] for r in (first, second)] == [0, 1]
    assert [span["version"] for r in (first, second) for span in _spans(r)] == ["default", "step-1"]


@pytest.mark.parametrize("version", VERSIONS)
def test_an_engine_paused_by_someone_else_loses_no_agent_call(tmp_path: Path, version: str) -> None:
    """0.32 holds a new request while paused; 0.33 / 0.34 refuse it with a retryable 503, which the
    recorder absorbs: either way the agent's call is answered once the engine resumes."""
    with _stack(tmp_path, version) as (engine, admin):
        s = admin.create_session()
        engine.pause("wait")
        result: dict = {}
        caller = threading.Thread(target=lambda: result.setdefault("reply", httpx.post(
            f"{s['base_url']}/chat/completions", timeout=120, headers={"authorization": f"Bearer {s['secret']}"},
            json={"model": "reference-model", "messages": [{"role": "user", "content": "hi"}]})))
        caller.start()
        deadline = time.monotonic() + 30
        while not any(r.get("path") == "/v1/chat/completions" for r in engine.requests()) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
        assert caller.is_alive(), "the agent waits; it is not handed an engine failure"
        engine.resume()
        caller.join(60)
        [record] = admin.records(s["session_id"])
    assert result["reply"].status_code == 200, result["reply"].text
    assert record["metadata"]["status"] == "ok"
    held_by_recorder = "engine_paused" in record["metadata"]
    assert held_by_recorder is (version != "0.32")


@pytest.mark.parametrize("version", VERSIONS)
def test_an_empty_tools_array_is_answered_as_the_release_answers_it(tmp_path: Path, version: str) -> None:
    with _stack(tmp_path, version) as (_engine, admin):
        s = admin.create_session()
        reply = httpx.post(f"{s['base_url']}/chat/completions", timeout=60,
                           headers={"authorization": f"Bearer {s['secret']}"},
                           json={"model": "reference-model", "tools": [],
                                 "messages": [{"role": "user", "content": "hi"}]})
        [record] = admin.records(s["session_id"])
    if version == "0.34":  # treated as no tools
        assert reply.status_code == 200 and record["metadata"]["status"] == "ok"
    else:  # the engine's 400, relayed to the agent as the engine said it, and recorded as failed
        assert reply.status_code == 400 and "`tools` must not be an empty array" in reply.text
        assert record["metadata"]["status"] == "failed" and not record["metadata"]["trainable"]
