"""``openenv-harness train-demo --engine sglang``, as a user runs it: the RL loop closed on the real SGLang
CPU engine -- rollouts at version 0, one GRPO step, SGLang's own reload from disk through the recorder's
fence, rollouts at version 1 -- and the step-0 checks on SGLang's logprobs: the new weights score the new
records within the limits, the stale weights do not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from openenv_harness.trainer.limits import DEFAULT_LIMITS

pytestmark = [pytest.mark.real_engine, pytest.mark.cli, pytest.mark.slow]


def test_train_demo_closes_the_loop_on_sglang(tmp_path: Path, cli_paths: object) -> None:
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "openenv_harness.cli", "train-demo", "--engine", "sglang",
                           "--group", "2", "--next-rollouts", "1",
                           # ties (every answer cut at the token cap: reward 0) are common: draw on, as on vLLM
                           "--max-group", "8", "--out", str(out)],
                          capture_output=True, text=True, timeout=1800, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    assert "loop closed" in done.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["engine_family"] == "sglang"
    sync = report["sync"]
    assert (sync["outcome"], sync["method"], sync["version_before"], sync["version_after"]) == (
        "ok", "update_weights_from_disk", 0, 1)
    assert sync["engine_weight_version"] == "1"  # read back from SGLang's /model_info
    assert all(r["policy_versions"] == [0] for r in report["before"])
    assert all(r["policy_versions"] == [1] and r["trl_agrees"] for r in report["after"])
    after, stale = report["check_after"], report["check_stale"]
    assert after["delta_mean"] <= DEFAULT_LIMITS.delta_mean and after["kl_k3"] <= DEFAULT_LIMITS.kl_k3
    assert stale["delta_mean"] > after["delta_mean"] and stale["kl_k3"] > after["kl_k3"]
