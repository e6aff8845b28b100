"""Held-out evaluation: one policy's success on tasks it never trained on, with a 95 % interval.

The base and the trained policy are evaluated the same way -- the same agent, engine, tasks, seeds
and sampling (the training policy's temperature: the policy itself, not a greedier one) -- so their
difference is the training's. Success is the task's own verifier; an unscored rollout (the verifier
could not run) is counted apart, never as a failure. Intervals are Wilson's for one rate and
Newcombe's (hybrid Wilson score) for the difference of two independent rates: both stay inside
[0, 1] at the small counts a CPU run affords, where the normal approximation does not.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from openenv_harness.rollout import Task
from openenv_harness.rollout.report import run_rollout

Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a rate of ``successes`` in ``n``."""
    if n <= 0:
        raise ValueError("an interval needs at least one trial")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_difference(s1: int, n1: int, s2: int, n2: int, z: float = Z95) -> tuple[float, float]:
    """95 % interval of p2 - p1 (Newcombe's method 10: from each rate's Wilson interval)."""
    p1, p2 = s1 / n1, s2 / n2
    l1, u1 = wilson(s1, n1, z)
    l2, u2 = wilson(s2, n2, z)
    d = p2 - p1
    return (d - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2), d + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2))


@dataclass
class EvalOutcome:
    task: str
    seed: int
    reward: float | None
    calls: int
    error: str | None = None


@dataclass
class EvalReport:
    label: str
    outcomes: list[EvalOutcome] = field(default_factory=list)

    @property
    def scored(self) -> list[EvalOutcome]:
        return [o for o in self.outcomes if o.reward is not None]

    @property
    def successes(self) -> int:
        return sum(1 for o in self.scored if o.reward is not None and o.reward >= 1.0)

    def rate(self) -> float:
        return self.successes / len(self.scored) if self.scored else 0.0

    def interval(self) -> tuple[float, float]:
        return wilson(self.successes, len(self.scored))

    def by_level(self, levels: dict[str, Any]) -> dict[str, tuple[int, int]]:
        """(successes, scored) per task level (``levels``: task id -> level)."""
        out: dict[str, tuple[int, int]] = {}
        for o in self.scored:
            key = str(levels.get(o.task, "-"))
            s, n = out.get(key, (0, 0))
            out[key] = (s + (1 if o.reward is not None and o.reward >= 1.0 else 0), n + 1)
        return out

    def as_dict(self) -> dict[str, Any]:
        low, high = self.interval() if self.scored else (0.0, 0.0)
        return {"label": self.label, "scored": len(self.scored), "unscored": len(self.outcomes) - len(self.scored),
                "successes": self.successes, "rate": self.rate(), "interval95": [low, high],
                "outcomes": [asdict(o) for o in self.outcomes]}


def evaluate(make_factory: Callable[[Task, int], Any], tasks: Sequence[Task], *, label: str,
             seeds: Sequence[int] = (0,), concurrency: int = 2, timeout_s: float = 300.0,
             progress: Callable[[str], None] | None = None) -> EvalReport:
    """Every task once per seed through ``make_factory(task, seed)`` (a ``HarnessSessionFactory`` whose
    sampling carries the seed, so a policy's evaluation is reproducible); ``concurrency`` rollouts at a
    time (the engine batches them)."""
    say = progress or (lambda _m: None)
    jobs = [(task, seed) for seed in seeds for task in tasks]
    report = EvalReport(label)

    def one(job: tuple[Task, int]) -> EvalOutcome:
        task, seed = job
        result, session = run_rollout(make_factory(task, seed), task.id, timeout_s=timeout_s, seed=seed)
        if session is not None:
            session.close()
        return EvalOutcome(task.id, seed, result.reward, result.agent_calls, result.error)

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        for done, outcome in enumerate(pool.map(one, jobs), 1):
            report.outcomes.append(outcome)
            if done % 8 == 0 or done == len(jobs):
                say(f"{label}: {done}/{len(jobs)} rollouts, {report.successes} solved")
    return report
