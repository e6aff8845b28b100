"""``openenv-harness trace export`` on calls recorded through a recorder over loopback: a call kept
across a weight sync (keep-mode pause) and its neighbours, exported in every format, filtered by
staleness and straddle, and refused when there is nothing to train. Run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineConfig, EngineServer, Fault, Script, ToolCallSpec, Turn

ADMIN = "trace-export-admin-token-0123456789"
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def _export(session: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "openenv_harness.cli", "trace", "export", session, *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "250"})


def _chat(s: dict[str, Any], messages: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(f"{s['base_url']}/chat/completions", timeout=60, headers={"authorization": f"Bearer {s['secret']}"},
                      json={"model": "reference-model", "messages": messages, "tools": TOOLS})


def _straddle(engine: EngineServer, recorder: RecorderServer, admin: RecorderClient, s: dict[str, Any],
              messages: list[dict[str, Any]]) -> httpx.Response:
    """One call held at the engine (keep-mode pause) while the trainer syncs weights through the recorder:
    it starts under the old policy version and ends under the new one."""
    engine.pause("keep")
    result: dict[str, httpx.Response] = {}
    t = threading.Thread(target=lambda: result.setdefault("r", _chat(s, messages)))
    t.start()
    deadline = time.monotonic() + 30
    while recorder.ctx.fence.inflight == 0:  # the call is at the engine
        assert time.monotonic() < deadline and t.is_alive()
        time.sleep(0.01)
    admin.pause_engine("keep")
    httpx.post(engine.url + "/update_weight_version", json={"new_version": "weights-1"}).raise_for_status()
    assert admin.resume_engine()["policy_version"] == 1
    t.join(30)
    return result["r"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A store holding: ``stale`` (one call before the sync), ``straddle`` (a call kept across the sync,
    its continuation after it, then a new conversation), ``fresh`` (one call after the sync) and
    ``failed`` (an engine error, nothing sampled)."""
    store = tmp_path_factory.mktemp("export") / "records.db"
    with EngineServer(EngineConfig(vllm_version="0.33")) as engine:
        recorder = RecorderServer(RecorderConfig(store_path=str(store), engine_url=engine.url,
                                                 admin_token=ADMIN)).start()
        try:
            with RecorderClient(recorder.url, ADMIN) as admin:
                sessions = {name: admin.create_session() for name in ("stale", "straddle", "fresh", "failed")}
                ids = {name: s["session_id"] for name, s in sessions.items()}
                for name in ("stale", "fresh"):
                    engine.set_script(ids[name], Script(turns=[Turn(content=f"The {name} answer.")]))
                engine.set_script(ids["straddle"], Script(turns=[
                    Turn(content="Looking.", tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls"})]),
                    Turn(content="Done."), Turn(content="Another conversation.")]))
                engine.add_fault(ids["failed"], Fault(status=400, message="bad request"))
                assert _chat(sessions["stale"], [{"role": "user", "content": "before"}]).status_code == 200
                task = [{"role": "user", "content": "task"}]
                first = _straddle(engine, recorder, admin, sessions["straddle"], task)
                assert first.status_code == 200
                reply = first.json()["choices"][0]["message"]
                echoed = {"role": "assistant", "content": reply["content"], "tool_calls": reply["tool_calls"]}
                tool = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "a b"}
                assert _chat(sessions["straddle"], [*task, echoed, tool]).status_code == 200
                assert _chat(sessions["straddle"], [{"role": "user", "content": "unrelated"}]).status_code == 200
                assert _chat(sessions["fresh"], [{"role": "user", "content": "after"}]).status_code == 200
                assert _chat(sessions["failed"], [{"role": "user", "content": "x"}]).status_code == 400
                versions = [(r["metadata"]["policy_version_start"], r["metadata"]["policy_version_end"],
                             r["metadata"]["straddled_sync"]) for r in admin.records(ids["straddle"])]
                assert versions == [(0, 1, True), (1, 1, False), (1, 1, False)]
        finally:
            recorder.stop()
    yield {"store": str(store), **ids}


def _harness(recorded: dict[str, str], name: str, *args: str) -> tuple[list[dict[str, Any]], str]:
    done = _export(recorded[name], "--store", recorded["store"], "--format", "harness", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_harness_rows_carry_both_versions_and_the_straddle(recorded: dict[str, str]) -> None:
    rows, _ = _harness(recorded, "straddle")
    assert len(rows) == 2  # the chain across the sync, then the new conversation
    md = rows[0]["metadata"]
    sid = recorded["straddle"]
    assert [(s["node_id"], s["policy_version_start"], s["policy_version_end"], s["straddled_sync"])
            for s in md["segments"]] == [(f"{sid}/0", 0, 1, True), (f"{sid}/1", 1, 1, False)]
    assert (md["policy_version_start"], md["policy_version_end"], md["straddled_sync"]) == (0, 1, True)
    assert md["straddled_node_ids"] == [f"{sid}/0"]
    straddled = md["segments"][0]
    assert straddled["trainable_tokens"] == straddled["length"] > 0, "kept trainable: the trainer decides"
    spans = straddled["weight_versions"]
    assert spans and spans[-1]["end"] == straddled["length"], "the engine's spans travel with the segment"
    assert md["segments"][1]["weight_versions"][0]["version"] == "weights-1"
    last = rows[1]["metadata"]
    assert (last["policy_version_start"], last["policy_version_end"], last["straddled_sync"]) == (1, 1, False)


@pytest.mark.slow  # the training format imports OpenEnv (~7 s)
def test_training_turns_carry_both_versions_and_their_row(recorded: dict[str, str]) -> None:
    from openenv.core.harness import TrainingTrace

    done = _export(recorded["straddle"], "--store", recorded["store"], "--format", "training")
    assert done.returncode == 0, done.stderr
    turns = TrainingTrace.model_validate_json(done.stdout).turns
    assert [(t.metadata["policy_version_start"], t.metadata["policy_version_end"], t.metadata["straddled_sync"])
            for t in turns] == [(0, 1, True), (1, 1, False), (1, 1, False)]
    assert [t.metadata["training_row"] for t in turns] == [
        {"index": 0, "policy_version_start": 0, "policy_version_end": 1, "straddled_sync": True},
        {"index": 0, "policy_version_start": 0, "policy_version_end": 1, "straddled_sync": True},
        {"index": 1, "policy_version_start": 1, "policy_version_end": 1, "straddled_sync": False}]
    assert all(t.metadata["weight_versions"] for t in turns)


def test_entries_carry_the_versions_as_recorded_and_filter_per_record(recorded: dict[str, str]) -> None:
    done = _export(recorded["straddle"], "--store", recorded["store"])
    assert done.returncode == 0 and done.stderr == ""
    rows = [json.loads(line)["metadata"] for line in done.stdout.splitlines()]
    assert [(m["policy_version_start"], m["policy_version_end"], m["straddled_sync"]) for m in rows] == [
        (0, 1, True), (1, 1, False), (1, 1, False)]
    filtered = _export(recorded["straddle"], "--store", recorded["store"], "--drop-straddled")
    assert filtered.returncode == 0, filtered.stderr
    assert [json.loads(line)["metadata"]["call_index"] for line in filtered.stdout.splitlines()] == [1, 2]
    assert "dropped 1 of 3 records: 1 straddled a weight sync" in filtered.stderr


def test_drop_straddled_drops_the_whole_row_and_keeps_the_other(recorded: dict[str, str]) -> None:
    rows, stderr = _harness(recorded, "straddle", "--drop-straddled")
    assert [r["metadata"]["node_ids"] for r in rows] == [[f"{recorded['straddle']}/2"]]
    assert f"session {recorded['straddle']}: dropped 1 of 2 rows: 1 straddled a weight sync" in stderr
    untouched, stderr = _harness(recorded, "fresh", "--drop-straddled")
    assert len(untouched) == 1 and "kept all 1 row" in stderr


def test_max_staleness_reads_the_current_version_from_the_store(recorded: dict[str, str]) -> None:
    rows, stderr = _harness(recorded, "straddle", "--max-staleness", "0")
    assert [r["metadata"]["node_ids"] for r in rows] == [[f"{recorded['straddle']}/2"]]
    assert "1 stale (oldest policy version below 1; current version 1, the highest recorded in the store" in stderr
    kept, _ = _harness(recorded, "stale", "--max-staleness", "1")
    assert len(kept) == 1
    given, stderr = _harness(recorded, "fresh", "--max-staleness", "1", "--current-version", "2")
    assert len(given) == 1 and "current version 2, given by --current-version" in stderr


def test_filters_that_leave_nothing_are_an_error_not_an_empty_file(recorded: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    done = _export(recorded["stale"], "--store", recorded["store"], "--format", "harness", "--max-staleness", "0",
                   "--out", str(out))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (f"error: session {recorded['stale']}: the filters left nothing to export (dropped 1 of 1 row: 1 stale"
            in done.stderr)
    assert not out.exists()
    entries = _export(recorded["stale"], "--store", recorded["store"], "--max-staleness", "2",
                      "--current-version", "9")
    assert entries.returncode == 2 and "the filters left nothing to export (dropped 1 of 1 record" in entries.stderr


def test_a_known_session_with_nothing_trainable_is_an_error(recorded: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    done = _export(recorded["failed"], "--store", recorded["store"], "--format", "harness", "--out", str(out))
    assert done.returncode == 2 and not out.exists()
    assert f"error: session {recorded['failed']} has nothing trainable in format harness: 1 record: 1 failed call" \
        in done.stderr
    assert "hint:" in done.stderr
    entries = _export(recorded["failed"], "--store", recorded["store"])
    assert entries.returncode == 0 and json.loads(entries.stdout)["metadata"]["status"] == "failed"


def test_an_unknown_session_and_a_lone_current_version_still_error(recorded: dict[str, str]) -> None:
    unknown = _export("no-such-session", "--store", recorded["store"], "--format", "harness")
    assert unknown.returncode == 2 and "no records for session no-such-session" in unknown.stderr
    lone = _export(recorded["fresh"], "--store", recorded["store"], "--current-version", "3")
    assert lone.returncode == 2 and "--current-version is only read by --max-staleness" in lone.stderr


def test_a_recorders_current_version_is_its_fences(tmp_path: Path) -> None:
    """From a running recorder the current version is the one it records new calls under -- even with no
    call recorded under it yet; the same records read from the store file know only their own."""
    store = tmp_path / "r.db"
    with EngineServer() as engine:
        recorder = RecorderServer(RecorderConfig(store_path=str(store), engine_url=engine.url,
                                                 admin_token=ADMIN)).start()
        try:
            with RecorderClient(recorder.url, ADMIN) as admin:
                s = admin.create_session()
                engine.set_script(s["session_id"], Script(turns=[Turn(content="ok")]))
                assert _chat(s, [{"role": "user", "content": "hi"}]).status_code == 200
                admin.set_policy_version(3)
            live = ["--url", recorder.url, "--admin-token", ADMIN, "--format", "harness"]
            stale = _export(s["session_id"], *live, "--max-staleness", "2")
            assert stale.returncode == 2 and "current version 3, the recorder's current policy version" in stale.stderr
            kept = _export(s["session_id"], *live, "--max-staleness", "3")
            assert kept.returncode == 0 and len(json.loads(kept.stdout)) == 1
        finally:
            recorder.stop()
    stored = _export(s["session_id"], "--store", str(store), "--format", "harness", "--max-staleness", "0")
    assert stored.returncode == 0 and "current version 0, the highest recorded in the store" in stored.stderr
