"""``openenv-harness train`` on the real stack, interrupted and resumed: its own vLLM, unmodified Pi
acting unconstrained on generated tasks, a checkpoint and a metrics line per iteration, and a second
invocation with the same ``--out`` that goes on from the last checkpoint -- the trainer's step count
continues, the engine serves the checkpoint's weights before the first rollout, and the held-out
evaluation of the base (before) and the trained policy (after) lands in ``learning.json``.

Small on purpose (groups of 2, two calls a rollout): what is tested is the run's bookkeeping on the
real parts, not learning; ``benchmarks/learning_curve.py`` measures that.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

ARGS = ["--group", "2", "--next-rollouts", "1", "--max-agent-calls", "2", "--max-tokens", "64", "--layers", "1",
        "--lr", "1e-4", "--eval-split", "held_out",
        # the tier's other engines hold their KV caches while this one starts: 1 GiB is ~80k ids, plenty here
        "--kv-cache-gib", "1"]


def _train(tasks: Path, out: Path, iterations: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "openenv_harness.cli", "train", "--tasks", str(tasks), *ARGS,
                           "--iterations", str(iterations), "--out", str(out)],
                          capture_output=True, text=True, timeout=2400)


def test_train_checkpoints_every_iteration_and_resumes_from_the_last(tmp_path: Path) -> None:
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "run"
    made = subprocess.run([sys.executable, "-m", "openenv_harness.cli", "tasks", "generate", "--out", str(tasks),
                           "--train", "3", "--held-out", "2", "--levels", "1"], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    first = _train(tasks, out, 1)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["iteration"] for line in lines] == [0]
    assert (out / "checkpoints" / "iteration-0000" / "trainer_state.json").is_file()
    learning = json.loads((out / "learning.json").read_text())
    assert learning["base"]["policy_version"] == 0 and len(learning["base"]["outcomes"]) == 2

    second = _train(tasks, out, 2)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resuming after iteration 0" in second.stdout
    assert "loading the resumed weights" in second.stdout
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["iteration"] for line in lines] == [0, 1]
    # the second iteration's step count follows the first's (the checkpoint's), on the next task
    assert lines[1]["trainer_step"] == lines[0]["trainer_step"] + (1 if lines[1]["stepped"] else 0)
    assert lines[1]["task"] != lines[0]["task"]
    # a fresh recorder: the resumed weights were synced in (version 1) before the group was drawn at it
    assert lines[1]["policy_version_before"] == 1 and lines[1]["policy_version_after"] == 2
    for line in lines:
        assert line["trainable_share"] == 1.0  # unconstrained: every sampled id trains with its logprob
        assert line["trl_agrees"] is True
        assert line["floor_delta_mean"] < 0.03  # the new weights score their own records at the floor
    learning = json.loads((out / "learning.json").read_text())
    assert learning["iterations"] == 2 and learning["trained"]["policy_version"] == 2
    assert learning["base"]["policy_version"] == 0  # the base evaluation was kept, not redone
    assert "held-out success base" in second.stdout
