"""A many-iteration run's files: metrics lines from real loop reports, the history a resume starts
from (a line without a whole checkpoint, or a torn line, ends it), and the learning-curve picture and
table the benchmark draws from them (``benchmarks/learning_curve.py``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from openenv_harness.trainer.grpo import StepReport
from openenv_harness.trainer.loop_report import LoopReport, RolloutSummary, StateTrace
from openenv_harness.trainer.train_loop import LoopSettings
from openenv_harness.trainer.training_run import TrainingRun, iteration_metrics
from openenv_harness.trainer.verify import DeltaStats
from openenv_harness.trainer.weight_sync import SyncReport

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import learning_curve  # noqa: E402


def _report(index: int, rewards: list[float]) -> LoopReport:
    before = [RolloutSummary(f"s{index}-{i}", i, [index], r, r, 2, 40, 1, 40, True, task=f"task-{index}")
              for i, r in enumerate(rewards)]
    after = [RolloutSummary(f"a{index}", 9, [index + 1], 1.0, 1.0, 1, 20, 1, 20, True, task=f"task-{index + 1}")]
    step = StepReport(len(rewards), 160, [0.5, -0.5], 0.1, 0.8, 0.9, 1.1, 1.0, 16, 1000, 2e-5)
    stats = DeltaStats(tokens=160, delta_mean=0.01, delta_max=0.2, delta_p99=0.1, share_within=0.9, kl_k3=1e-4)
    return LoopReport({"task": f"task-{index}"}, index, index + 1, before, step, SyncReport(index, index + 1, "/w"),
                      after, stats, stats, DeltaStats(tokens=20, delta_mean=0.05, kl_k3=2e-3), {"update": 3.0},
                      state=StateTrace(index + 1, index + 1, "a", "b", "c"))


def test_metrics_carry_the_verifier_reward_the_update_and_the_checks() -> None:
    line = iteration_metrics(3, _report(3, [1.0, 0.0, 0.0, 1.0]), 12.34)
    assert line["task"] == "task-3" and line["after_task"] == "task-4"
    assert line["task_reward_mean"] == 0.5 and line["after_task_reward_mean"] == 1.0
    assert (line["policy_version_before"], line["policy_version_after"], line["trainer_step"]) == (3, 4, 4)
    assert line["trainable_share"] == 1.0 and line["trained_tokens"] == 160
    assert line["clip_fraction"] == pytest.approx(0.1) and line["update_kl_k3"] == 2e-3
    assert line["trl_agrees"] is True and line["wall_s"] == 12.3
    json.dumps(line)  # a metrics line is JSON as it is


def _settings(tmp_path: Path) -> LoopSettings:
    return LoopSettings(engine_url="http://e", recorder_url="http://r", admin_token="t", model="m",
                        model_dir=Path("/m"), workdir=tmp_path)


def test_the_history_ends_at_the_last_line_with_a_whole_checkpoint(tmp_path: Path) -> None:
    run = TrainingRun(_settings(tmp_path), tmp_path, 10)
    assert run.completed() == 0
    lines = [iteration_metrics(i, _report(i, [1.0, 0.0]), 1.0) for i in range(3)]
    run.metrics_path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"iteration": 3, "ta')
    for i in range(3):
        run.checkpoint(i).mkdir(parents=True)
    (run.checkpoint(0) / "trainer_state.json").write_text("{}")
    (run.checkpoint(1) / "trainer_state.json").write_text("{}")
    # iteration 2's checkpoint has no metadata (its save was interrupted): the run resumes after 1
    assert [line["iteration"] for line in run.history()] == [0, 1]
    (run.checkpoint(2) / "trainer_state.json").write_text("{}")
    assert run.completed() == 3  # and the torn fourth line is not an iteration
    with pytest.raises(ValueError):
        TrainingRun(_settings(tmp_path), tmp_path, 0)


def test_pruning_keeps_the_newest_checkpoints_and_weights_and_the_whole_history(tmp_path: Path) -> None:
    import os

    run = TrainingRun(_settings(tmp_path), tmp_path, 10, keep=2)
    lines = [iteration_metrics(i, _report(i, [1.0, 0.0]), 1.0) for i in range(4)]
    run.metrics_path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    for i in range(4):
        run.checkpoint(i).mkdir(parents=True)
        (run.checkpoint(i) / "trainer_state.json").write_text("{}")
        served = tmp_path / f"policy-v{i + 1}"
        served.mkdir()
        os.utime(served, (1_000 + i, 1_000 + i))
    run.prune()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["iteration-0002", "iteration-0003"]
    assert sorted(p.name for p in tmp_path.glob("policy-*")) == ["policy-v3", "policy-v4"]
    assert run.completed() == 4  # the lines of pruned iterations still count: the last one's checkpoint is whole
    with pytest.raises(ValueError, match="keep"):
        TrainingRun(_settings(tmp_path), tmp_path, 10, keep=0)


def test_the_learning_curve_is_drawn_and_tabled_from_a_run(tmp_path: Path) -> None:
    metrics = [iteration_metrics(i, _report(i, [float(i % 2), 0.0, 1.0, 0.0]), 5.0) for i in range(4)]
    learning = {"base": {"successes": 6, "scored": 32, "rate": 6 / 32, "policy_version": 0,
                         "levels": {"1": [5, 11], "2": [1, 11], "3": [0, 10]}},
                "trained": {"successes": 14, "scored": 32, "rate": 14 / 32, "policy_version": 10,
                            "levels": {"1": [10, 11], "2": [4, 11], "3": [0, 10]}}}
    png = learning_curve.plot(metrics, learning, tmp_path / "curve.png", title="t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    text = learning_curve.table(metrics, learning)
    assert "| base (version 0) | 6/32 | 18.8% |" in text and "| trained (version 10) | 14/32 | 43.8% |" in text
    assert "| difference | | +25.0% | [+2.3%, +44.6%] |" in text
    assert "| 1 | 5/11 | 10/11 |" in text and "| update | 12 | 3.0 |" in text
    assert "4 iterations" in text and "TRL agrees on every iteration: True" in text
