"""What one iteration of the RL loop (``train_loop.py``) reports, and when that proves the loop.

Plain data, apart from the loop that fills it: a report can be read back from ``report.json`` and
judged without torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from openenv_harness.trainer.grpo import StepReport
from openenv_harness.trainer.limits import DEFAULT_LIMITS, DeltaStats
from openenv_harness.trainer.weight_sync import SyncReport


@dataclass
class RolloutSummary:
    session_id: str
    seed: int
    policy_versions: list[int]
    task_reward: float | None
    reward: float | None
    calls: int
    sampled_tokens: int
    rows: int
    trainable_tokens: int
    #: TRL's own reconciliation of the same records gives the same trainable tokens (None: TRL absent)
    trl_agrees: bool | None = None
    error: str | None = None
    #: the task's id
    task: str | None = None


@dataclass
class StateTrace:
    """The trainer's state around one iteration's step: what shows that a step starts from the
    previous step's fp32 masters and Adam state, and that the engine got a bf16 copy of them."""

    #: updates taken after this step (``TrainerState.step``) and Adam's own count on the trained parameters
    step: int
    adam_steps: int
    #: digests (``state.weights_digest``) of the masters before and after the step, and of the bf16 copy served
    master_before: str
    master_after: str
    served_after: str
    #: the trained tensors (the trainer's names) whose bf16 copy the step changed: what the sync must change
    #: in the engine, and nothing else
    served_changed: list[str] = field(default_factory=list)


@dataclass
class LoopReport:
    settings: dict[str, Any]
    version_before: int
    version_after: int
    before: list[RolloutSummary]
    step: StepReport
    sync: SyncReport
    after: list[RolloutSummary]
    #: the trainer's logprobs of the version-v records against the engine's (the noise floor)
    check_before: DeltaStats
    #: the trainer's new weights on the version-v+1 records (must sit at the floor)
    check_after: DeltaStats
    #: the old weights on the version-v+1 records (must not)
    check_stale: DeltaStats
    phases: dict[str, float] = field(default_factory=dict)
    restored: SyncReport | None = None
    state: StateTrace | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def problems(self) -> list[str]:
        """What keeps this iteration from proving the loop (empty: proven). Each step-0 check is held to
        the limits ``trace verify`` applies (``trainer/limits.py``, derived in docs/real-engine.md)."""
        out = []
        if any(r.policy_versions != [self.version_after] for r in self.after):
            out.append(f"records after the sync do not all carry version {self.version_after}")
        if self.version_after != self.version_before + 1:
            out.append(f"the sync moved the version from {self.version_before} to {self.version_after}")
        before = DEFAULT_LIMITS.failures(self.check_before)
        if before:
            out.append(f"the version {self.version_before} weights do not score the version {self.version_before} "
                       "records within the step-0 limits (" + "; ".join(f.text for f in before) + ")")
        if not self.at_floor:
            out.append("the new weights do not score the new records within the step-0 limits ("
                       + "; ".join(f.text for f in DEFAULT_LIMITS.failures(self.check_after)) + ")")
        if self.step.stepped and not self.stale_detected:  # a step not taken leaves nothing stale to tell apart
            out.append(f"the stale weights were not told apart from the new ones (mean |δ| "
                       f"{self.check_stale.delta_mean:.4f} against {self.check_after.delta_mean:.4f}; "
                       f"limits: {DEFAULT_LIMITS.summary()})")
        if any(r.trl_agrees is False for r in [*self.before, *self.after]):
            out.append("TRL's reconciliation of the records differs from the project's assembler")
        return out

    @property
    def stale_detected(self) -> bool:
        """The old weights -- a trainer that missed the sync -- score the new records outside the step-0
        limits, and clearly further than the new weights do (mean |δ| more than twice theirs): the check
        that passes the synced trainer fails the stale one."""
        return (bool(DEFAULT_LIMITS.failures(self.check_stale))
                and self.check_stale.delta_mean > 2 * self.check_after.delta_mean)

    @property
    def at_floor(self) -> bool:
        """The new weights score the new records within the step-0 limits: the same bound ``trace verify``
        applies to any session, not a multiple of this run's own floor."""
        return not DEFAULT_LIMITS.failures(self.check_after)
