"""``examples/assemble_offline.py`` run as a program on records a real recorder session produced.

The session mixes what the example has to show: exact steps, a replay drift (an argument the
agent re-serializes), an aux summarizer call, and a compaction break.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineServer, Script, ToolCallSpec, Turn, agent_echo

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "assemble_offline.py"
ADMIN = "assemble-offline-admin-token-0123456789"
MODEL = "offline-example"
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
                                           "parameters": {"type": "object",
                                                          "properties": {"command": {"type": "string"}}}}}]
SCRIPT = Script(turns=[
    Turn(content="Listing.", tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls"})]),
    # sampled with odd spacing: neither the agent's re-serialization nor the engine's re-rendering gives it back
    Turn(tool_calls=[ToolCallSpec(name="bash", arguments='{"command":  "cat notes.txt"}')]),
    Turn(content="Testing.", tool_calls=[ToolCallSpec(name="bash", arguments={"command": "pytest -q"})]),
    Turn(content="All done."),
])


def _call(http: httpx.Client, url: str, messages: list[dict[str, Any]], tools: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": 256}
    if tools:
        body["tools"] = TOOLS
    response = http.post(f"{url}/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]


def _agent_loop(http: httpx.Client, url: str, task: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": task}]
    for _ in range(10):
        message = _call(http, url, messages)
        messages.append(agent_echo(message, "opencode"))
        if not message.get("tool_calls"):
            return messages
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ok\n"} for c in message["tool_calls"]]
    raise AssertionError("the scripted agent did not finish")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("offline")
    store = folder / "records.db"
    with EngineServer() as engine, RecorderServer(
        RecorderConfig(store_path=str(store), engine_url=engine.url, admin_token=ADMIN)
    ) as recorder, RecorderClient(recorder.url, ADMIN) as admin:
        engine.set_script(MODEL, SCRIPT)
        session = admin.create_session(harness="opencode")
        with httpx.Client(timeout=60, headers={"authorization": f"Bearer {session['secret']}"}) as http:
            history = _agent_loop(http, session["base_url"], "Fix the failing test.")
            summary = _call(http, session["base_url"], [
                {"role": "system", "content": "You are a context summarization agent."},
                {"role": "user", "content": json.dumps(history)}], tools=False)
            _agent_loop(http, session["base_url"], f"Summary: {summary['content']}. Finish the task.")
        admin.close_session(session["session_id"])
        records = admin.records(session["session_id"])
        export = folder / "session.jsonl"
        export.write_text("".join(json.dumps(r) + "\n" for r in records))
        yield {"store": store, "export": export, "url": recorder.url, "session_id": session["session_id"],
               "records": records}


def _run(*args: str, env_token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"}
    if env_token:
        env["OEH_ADMIN_TOKEN"] = env_token
    return subprocess.run([sys.executable, str(EXAMPLE), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=env, check=False)


def _summary(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    (session,) = json.loads(done.stdout)["sessions"]
    return session


def test_store_shows_chains_transitions_and_strategies(recorded: dict[str, Any]) -> None:
    session = _summary(_run("--store", str(recorded["store"]), "--json"))
    assert session["session_id"] == recorded["session_id"]
    assert session["records"] == len(recorded["records"]) == 9
    assert session["agent_calls"] == 8 and session["excluded"] == {"aux": 1}
    assert session["transitions"] == {"exact": 4, "replay_drift": 2, "break": 1}

    first, second = session["chains"]
    assert [call["transition"]["kind"] for call in first["calls"]] == ["start", "exact", "replay_drift", "exact"]
    assert [call["transition"]["kind"] for call in second["calls"]] == ["break", "exact", "replay_drift", "exact"]
    drift = first["calls"][2]["transition"]
    assert drift["from_call"] == 1 and drift["drift_tokens"] > 0
    assert drift["divergence"] > first["calls"][1]["prompt_tokens"]
    brk = second["calls"][0]["transition"]
    assert brk["kind"] == "break" and brk["cause"] == "history_rewrite" and brk["from_call"] == 3
    assert second["calls"][0]["call_index"] == 5  # call 4 is the aux summarizer, left out

    split, realign, approximate = (session["strategies"][s] for s in ("split", "realign", "approximate"))
    assert split["samples"] == 4 and split["lost_tokens"] == 0  # each drift closes a sample; the break, a chain
    assert realign["samples"] == 2 and realign["lost_tokens"] > 0
    assert approximate["samples"] == 2 and approximate["approximate_samples"] == 2
    assert realign["trainable_tokens"] == split["trainable_tokens"] - realign["lost_tokens"]
    assert 0 < split["trainable_ratio"] <= 1


def test_jsonl_export_and_live_recorder_give_the_same_summary(recorded: dict[str, Any]) -> None:
    from_store = _summary(_run("--store", str(recorded["store"]), "--json"))
    assert _summary(_run("--records", str(recorded["export"]), "--json")) == from_store
    live = _run("--url", recorded["url"], "--session", recorded["session_id"], "--json", env_token=ADMIN)
    assert _summary(live) == from_store


def test_text_output_names_every_transition(recorded: dict[str, Any]) -> None:
    done = _run("--records", str(recorded["export"]))
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert f"session {recorded['session_id']}: 9 records, 8 agent calls (left out: 1 aux)" in text
    assert "chains: 2   transitions: 4 exact, 2 replay_drift, 1 break" in text
    assert "replay_drift from call 1: diverges at token" in text
    assert "break (history_rewrite) from call 3: shares" in text
    for strategy in ("split", "realign", "approximate"):
        assert any(line.split()[:2] == [strategy, "4" if strategy == "split" else "2"] for line in text.splitlines())


def test_bad_sources_fail_with_a_clear_message(recorded: dict[str, Any], tmp_path: Path) -> None:
    missing = _run("--store", str(tmp_path / "nope.db"))
    assert missing.returncode == 1 and "no record store at" in missing.stderr
    no_token = _run("--url", recorded["url"])
    assert no_token.returncode == 1 and "admin token" in no_token.stderr
    wrong_token = _run("--url", recorded["url"], env_token="not-the-token-000000000000")
    assert wrong_token.returncode == 1 and "HTTP 401" in wrong_token.stderr
    unknown = _run("--records", str(recorded["export"]), "--session", "s-unknown")
    assert unknown.returncode == 1 and "s-unknown" in unknown.stderr
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text('{"not": "a record"}\n')
    bad = _run("--records", str(garbage))
    assert bad.returncode == 1 and "garbage.jsonl:1" in bad.stderr
