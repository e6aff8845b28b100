"""``openenv-harness run`` drives each agent through a built-in task on the embedded engine (a subprocess,
as a user runs it): exit 0, reward 1, one exact chain."""

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
def test_run_kilo_on_the_embedded_engine(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = cli("run", "--harness", "kilo", "--task", "fix-add", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [row] = json.loads((out / "summary.json").read_text())
    # cat, sed, the tests, then the answer
    assert (row["harness"], row["task"], row["exit_code"], row["reward"], row["agent_calls"], row["aux_calls"]) == (
        "kilo", "fix-add", 0, 1.0, 4, 0)
    assert row["fidelity"] == {"exact": 3, "replay_drift": 0, "break": 0} and row["rows"] == 1
    entries = cli("trace", "export", row["session_id"], "--store", str(out / "records.db"), "--format", "entries")
    records = [json.loads(line) for line in entries.stdout.splitlines()]
    assert [r["metadata"]["dialect"] for r in records] == ["chat"] * 4
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact", "exact", "exact"]
    for prev, rec in zip(records, records[1:]):  # one exact chain: each prompt extends the last call's tokens
        chain = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert rec["prompt_token_ids"][:len(chain)] == chain
    replayed = [c for m in records[-1]["request"]["messages"] for c in m.get("tool_calls") or []]
    assert [c["function"]["name"] for c in replayed] == ["bash"] * 3
