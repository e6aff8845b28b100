"""Many loop iterations as one resumable run: a checkpoint and a metrics line after every iteration.

A run of tens of iterations on a CPU takes an hour or more, and machines stop. Each iteration ends
with the trainer's checkpoint (fp32 masters, Adam's state, the step: ``TrainerState.save_checkpoint``)
and then one line in ``metrics.jsonl``: a line is written only once its checkpoint is whole, so the
last line always names a checkpoint that loads. Older checkpoints and served-weight folders are
removed as the run goes (``prune``). ``resume`` starts from it: the trainer loads the
checkpoint, the engine is given the checkpoint's bf16 weights through the recorder's fence (a fresh
engine serves the base weights), and the next iteration takes the next task and fresh seeds.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from openenv_harness.trainer.loop_report import LoopReport
from openenv_harness.trainer.train_loop import LoopSettings, TrainLoop

METRICS = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
#: seeds an iteration may use before the next iteration's begin (a group redraws while its rewards tie)
SEEDS_PER_ITERATION = 1000


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def iteration_metrics(index: int, report: LoopReport, wall_s: float) -> dict[str, Any]:
    """One iteration's numbers: the verifier's rewards (the task's own), the shaped reward apart, the
    update's statistics, and the checks that tie the records to the weights."""
    step = report.step
    task_rewards = [r.task_reward for r in report.before if r.task_reward is not None]
    after_rewards = [r.task_reward for r in report.after if r.task_reward is not None]
    sampled = sum(r.sampled_tokens for r in report.before)
    trainable = sum(r.trainable_tokens for r in report.before)
    return {
        "iteration": index,
        "task": report.settings.get("task"),
        "policy_version_before": report.version_before,
        "policy_version_after": report.version_after,
        "trainer_step": report.state.step if report.state is not None else None,
        "rollouts": len(report.before),
        "task_rewards": [r.task_reward for r in report.before],
        "task_reward_mean": _mean(task_rewards),
        "shaped_rewards": [r.reward for r in report.before],
        "after_task": report.after[0].task if report.after else None,
        "after_task_rewards": [r.task_reward for r in report.after],
        "after_task_reward_mean": _mean(after_rewards),
        "sampled_tokens": sampled,
        "trainable_tokens": trainable,
        "trainable_share": trainable / sampled if sampled else None,
        #: ids whose gradient the step applied (0 when every advantage was 0: the optimizer did not step)
        "trained_tokens": step.trainable_tokens if step.stepped else 0,
        "stepped": step.stepped,
        "advantages": step.advantages,
        "loss": step.loss,
        "grad_norm": step.grad_norm,
        "clip_fraction": step.clipped_tokens / step.trainable_tokens if step.trainable_tokens else 0.0,
        "gradient_clip_fraction": step.gradient_clipped_tokens / step.trainable_tokens if step.trainable_tokens else 0.0,
        #: KL(new || old) estimated (k3) on the records sampled by the new policy, scored by the old weights
        "update_kl_k3": report.check_stale.kl_k3,
        #: the new weights on their own records: the step-0 floor every version must sit at
        "floor_delta_mean": report.check_after.delta_mean,
        "floor_tokens": report.check_after.tokens,
        "trl_agrees": all(r.trl_agrees is not False for r in report.before + report.after),
        "problems": report.problems(),
        "phases": report.phases,
        "wall_s": round(wall_s, 1),
    }


class TrainingRun:
    """``iterations`` loop iterations in ``run_dir``; ``run()`` yields each iteration's metrics and goes
    on from the last whole checkpoint there (``completed``)."""

    def __init__(self, settings: LoopSettings, run_dir: Path, iterations: int, *,
                 progress: Callable[[str], None] | None = None, keep: int = 2) -> None:
        if iterations < 1:
            raise ValueError(f"iterations must be at least 1, got {iterations}")
        if keep < 1:
            raise ValueError(f"keep must be at least 1 (a resume needs the last checkpoint), got {keep}")
        self.keep = keep
        self.settings = settings
        self.run_dir = run_dir
        self.iterations = iterations
        self.progress = progress or (lambda _m: None)
        self.loop: TrainLoop | None = None

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / METRICS

    def checkpoint(self, index: int) -> Path:
        return self.run_dir / CHECKPOINTS / f"iteration-{index:04d}"

    def history(self) -> list[dict[str, Any]]:
        """The metrics of the iterations done: whole lines, up to the last one whose checkpoint is whole
        (a torn last line, or a line whose checkpoint is gone, is not an iteration to resume after)."""
        if not self.metrics_path.is_file():
            return []
        lines: list[dict[str, Any]] = []
        for text in self.metrics_path.read_text().splitlines():
            try:
                lines.append(json.loads(text))
            except ValueError:
                break
        while lines and not (self.checkpoint(int(lines[-1]["iteration"])) / "trainer_state.json").is_file():
            lines.pop()
        return lines

    def prune(self) -> None:
        """Keep the ``keep`` newest checkpoints and served-weight folders: a resume needs the last whole
        checkpoint, a sync that rolls back needs the weights served before it; each older one is about a
        gigabyte on the 0.5B model."""
        checkpoints = sorted((self.run_dir / CHECKPOINTS).glob("iteration-*"))
        served = sorted(self.run_dir.glob("policy-*"), key=lambda p: p.stat().st_mtime)
        for folder in checkpoints[: -self.keep] + served[: -self.keep]:
            shutil.rmtree(folder, ignore_errors=True)

    def completed(self) -> int:
        return len(self.history())

    def run(self) -> Iterator[dict[str, Any]]:
        done = self.completed()
        if done >= self.iterations:
            self.progress(f"all {self.iterations} iterations are done in {self.run_dir}")
            return
        s = self.settings
        if done:
            s = replace(s, resume_from=self.checkpoint(done - 1), first_task=s.first_task + done,
                        seed=s.seed + done * SEEDS_PER_ITERATION)
            self.progress(f"resuming after iteration {done - 1} from {s.resume_from}")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.loop = loop = TrainLoop(s, progress=self.progress)
        if s.resume_from is not None:
            loop.serve_resumed()
        started = time.perf_counter()
        for index, report in enumerate(loop.iterations(self.iterations - done), start=done):
            assert loop.state is not None
            loop.state.save_checkpoint(self.checkpoint(index))
            line = iteration_metrics(index, report, time.perf_counter() - started)
            with self.metrics_path.open("a") as fh:
                fh.write(json.dumps(line, default=str) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            (self.run_dir / f"report-{index:04d}.json").write_text(json.dumps(report.as_dict(), indent=1, default=str))
            self.prune()
            self.progress(f"iteration {index + 1}/{self.iterations}: task {line['task']} reward "
                          f"{line['task_reward_mean']}, after the sync {line['after_task_reward_mean']}, "
                          f"{line['trained_tokens']} trained ids, KL {line['update_kl_k3']}")
            started = time.perf_counter()
            yield line
