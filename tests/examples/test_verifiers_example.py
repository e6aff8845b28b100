"""``examples/verifiers_env.py`` run with the verifiers environment's Python on real recorded sessions.

Two sessions are recorded through the recorder and the reference engine: a clean one, and one
whose agent renames tool-call ids (where verifiers' message grouping and ours differ). The example
runs in ``.venv-verifiers`` (verifiers cannot be installed next to OpenEnv); the episodes it saves
are read back here as plain JSON, the way any consumer of verifiers' ``traces.jsonl`` sees them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineServer, Script, ToolCallSpec, Turn, agent_echo

pytestmark = pytest.mark.compat

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "verifiers_env.py"
VERIFIERS_PYTHON = ROOT / ".venv-verifiers" / "bin" / "python"
ADMIN = "verifiers-example-admin-token-0123456789"
MODEL = "verifiers-example"
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
                                           "parameters": {"type": "object",
                                                          "properties": {"command": {"type": "string"}}}}}]
SCRIPT = Script(turns=[
    Turn(content="Listing.", tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls"})]),
    Turn(tool_calls=[ToolCallSpec(name="bash", arguments={"command": "pytest -q"})]),
    Turn(content="All done."),
])


def _run_session(admin: RecorderClient, *, rename_ids: bool) -> list[dict[str, Any]]:
    session = admin.create_session(harness="opencode")
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                      {"role": "user", "content": "Fix the failing test."}]
    with httpx.Client(timeout=60, headers={"authorization": f"Bearer {session['secret']}"}) as http:
        for turn in range(10):
            body = {"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 256}
            response = http.post(f"{session['base_url']}/chat/completions", json=body)
            assert response.status_code == 200, response.text
            message = response.json()["choices"][0]["message"]
            echoed = agent_echo(message, "pi")
            for call in echoed.get("tool_calls") or []:
                if rename_ids:
                    call["id"] = f"tool_{turn}"
            messages.append(echoed)
            if not message.get("tool_calls"):
                break
            messages += [{"role": "tool", "tool_call_id": c["id"], "content": "ok\n"} for c in echoed["tool_calls"]]
    admin.close_session(session["session_id"])
    return admin.records(session["session_id"])


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not VERIFIERS_PYTHON.is_file():
        pytest.skip(f"{VERIFIERS_PYTHON} not found: create the verifiers environment (see examples/verifiers_env.py)")
    folder = tmp_path_factory.mktemp("vf-example")
    with EngineServer() as engine, RecorderServer(
        RecorderConfig(store_path=str(folder / "records.db"), engine_url=engine.url, admin_token=ADMIN)
    ) as recorder, RecorderClient(recorder.url, ADMIN) as admin:
        engine.set_script(MODEL, SCRIPT)
        clean = _run_session(admin, rename_ids=False)
        renamed = _run_session(admin, rename_ids=True)
        export = folder / "sessions.jsonl"
        export.write_text("".join(json.dumps(r) + "\n" for r in clean + renamed))
        yield {"clean": clean, "renamed": renamed, "export": export, "url": recorder.url, "folder": folder}


def _run(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "OEH_ADMIN_TOKEN")}
    if token:
        env["OEH_ADMIN_TOKEN"] = token
    return subprocess.run([str(VERIFIERS_PYTHON), str(EXAMPLE), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def _session_id(records: list[dict[str, Any]]) -> str:
    return records[0]["metadata"]["session_id"]


def _branches(trace: dict[str, Any]) -> list[list[int]]:
    """Token ids of every root-to-leaf path, from the saved graph alone."""
    nodes = trace["nodes"]
    parents = {n["parent"] for n in nodes if n.get("parent") is not None}
    paths = []
    for leaf in (i for i in range(len(nodes)) if i not in parents):
        chain, current = [], leaf
        while current is not None:
            chain.append(current)
            current = nodes[current].get("parent")
        paths.append([t for i in reversed(chain) for t in nodes[i].get("token_ids", [])])
    return paths


def test_sessions_become_verifiers_episodes(recorded: dict[str, Any]) -> None:
    clean, renamed = _session_id(recorded["clean"]), _session_id(recorded["renamed"])
    out = recorded["folder"] / "results"
    done = _run("--records", str(recorded["export"]), "--reward", f"{clean}=1", "--reward", f"{renamed}=none",
                "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    text = done.stdout
    assert f"session {clean}: 3 agent calls -> 1 verifiers branch(es), 1 split sample(s); identical: yes" in text
    assert f"session {renamed}: 3 agent calls -> 3 verifiers branch(es), 1 split sample(s); identical: no" in text
    assert "reward verify: 1.0" in text and "reward verify: unscored" in text
    assert f"wrote 2 episode(s) to {out / 'traces.jsonl'}" in text

    episodes = [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines()]
    assert [e["traces"][0]["info"]["openenv_harness"]["session_id"] for e in episodes] == [clean, renamed]
    assert all(e["env"]["id"] == "openenv-harness" and e["ok"] for e in episodes)
    first, second = (e["traces"][0] for e in episodes)
    assert first["rewards"] == {"verify": {"score": 1.0, "weight": 1.0}} and second["rewards"] == {"verify": None}
    last = recorded["clean"][-1]
    assert _branches(first) == [last["prompt_token_ids"] + last["completion_token_ids"]]
    assert _branches(second) == [r["prompt_token_ids"] + r["completion_token_ids"] for r in recorded["renamed"]]


def test_live_recorder_source(recorded: dict[str, Any]) -> None:
    done = _run("--url", recorded["url"], "--session", _session_id(recorded["clean"]), token=ADMIN)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "identical: yes" in done.stdout and "reward verify: unscored" in done.stdout


def test_bad_input_fails_clearly(recorded: dict[str, Any]) -> None:
    wrong = _run("--url", recorded["url"], token="not-the-admin-token-000000")
    assert wrong.returncode == 1 and "HTTP 401" in wrong.stderr
    unknown = _run("--records", str(recorded["export"]), "--session", "s-missing")
    assert unknown.returncode == 1 and "s-missing" in unknown.stderr
    bad_reward = _run("--records", str(recorded["export"]), "--reward", "s-x=high")
    assert bad_reward.returncode == 2 and "must be a number or 'none'" in bad_reward.stderr
