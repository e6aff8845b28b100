"""``openenv-harness run --sandbox docker``: Pi and OpenCode on every built-in task, each in a container
of its own with no network, reach the embedded engine only through the relay, and give reward 1 and
one exact chain per rollout -- the same records the local sandbox gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from openenv_harness.rollout import BUILTIN_TASKS

CLI = [sys.executable, "-m", "openenv_harness.cli"]


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "200"})


def _records(store: Path, session_id: str) -> list[dict[str, Any]]:
    done = cli("trace", "export", session_id, "--store", str(store), "--format", "entries")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _containers_of(pid: int) -> list[str]:
    """The sandbox containers a process (by pid) owns, as their owner labels say."""
    listed = subprocess.run(["docker", "ps", "-a", "--filter", "label=openenv-harness.sandbox", "--format",
                             '{{.Names}} {{.Label "openenv-harness.owner"}}'], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in listed.stdout.splitlines() if f":{pid}:" in line]


@pytest.mark.cli
@pytest.mark.slow
def test_pi_and_opencode_in_containers_on_every_builtin_task(tmp_path: Path, container_image: str) -> None:
    out = tmp_path / "run"
    tasks = sorted(BUILTIN_TASKS)
    run = subprocess.Popen([*CLI, "run", "--harness", "pi,opencode", "--task", ",".join(tasks), "--sandbox", "docker",
                            "--image", container_image, "--out", str(out)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
    stdout, stderr = run.communicate(timeout=600)
    assert run.returncode == 0, stdout[-3000:] + stderr[-3000:]
    rows = json.loads((out / "summary.json").read_text())
    assert sorted((r["harness"], r["task"]) for r in rows) == sorted(
        (h, t) for h in ("pi", "opencode") for t in tasks)
    for row in rows:
        assert (row["exit_code"], row["reward"]) == (0, 1.0), row
        assert row["fidelity"]["break"] == 0 and row["fidelity"]["replay_drift"] == 0, row
        assert row["fidelity"]["exact"] == row["agent_calls"] - 1 and row["rows"] == 1, row
        agent = [r for r in _records(out / "records.db", row["session_id"]) if r["metadata"]["call_kind"] == "agent"]
        assert len(agent) == row["agent_calls"] >= 2
        for prev, rec in zip(agent, agent[1:]):  # each prompt extends the last call's tokens
            chain = prev["prompt_token_ids"] + prev["completion_token_ids"]
            assert rec["prompt_token_ids"][:len(chain)] == chain
    assert _containers_of(run.pid) == []  # every rollout's container removed
