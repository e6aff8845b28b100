"""``openenv-harness run`` with each agent CLI on the embedded reference engine: reward, one exact chain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "openenv_harness.cli"]


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.cli
@pytest.mark.slow
def test_run_continue_on_the_embedded_engine(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = cli("run", "--harness", "continue", "--task", "fix-add", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [row] = json.loads((out / "summary.json").read_text())
    assert (row["harness"], row["task"], row["exit_code"], row["reward"], row["agent_calls"], row["aux_calls"]) == (
        "continue", "fix-add", 0, 1.0, 4, 0)
    assert row["fidelity"] == {"exact": 3, "replay_drift": 0, "break": 0} and row["rows"] == 1
    entries = cli("trace", "export", row["session_id"], "--store", str(out / "records.db"), "--format", "entries")
    records = [json.loads(line) for line in entries.stdout.splitlines()]
    assert [r["metadata"]["dialect"] for r in records] == ["chat"] * 4
    for prev, rec in zip(records, records[1:]):  # one exact chain: each prompt extends the last call's tokens
        chain = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert rec["prompt_token_ids"][:len(chain)] == chain
    calls = [c["function"]["name"] for r in records for c in r["response"]["choices"][0]["message"].get("tool_calls") or []]
    assert calls == ["Bash"] * 3
