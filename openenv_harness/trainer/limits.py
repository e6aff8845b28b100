"""The step-0 check in numbers: statistics of logp_trainer - logp_rollout, and the limits they must meet.

With the policy unchanged, a trainer scoring a record's sampled ids must get the engine's logprobs back
up to the arithmetic of two different kernels (vLLM may compute in bf16, a CPU trainer often in fp32).
How far that arithmetic moves a logprob is measured on the real engine (``docs/real-engine.md``,
"Step-0 limits"), and the limits below sit well above it and far below what a real mismatch gives
(another model's or a scripted engine's logprobs differ by whole nats).

Why absolute limits rather than a multiple of a floor measured in the same run: a bound that grows
with whatever the run measured passes a broken scorer whose "floor" is broken too. The numbers are
fixed; a caller may pass others (``trace verify --max-mean-delta ...``), but the defaults are the
documented ones.

Why several statistics: the mean catches a systematic offset (other weights, a temperature applied
twice), the p99 and the maximum catch a few tokens scored in another context (a misaligned id, a
dropped prompt token), and the share of ratios near 1 is what an importance-weighted loss sees.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

#: exp() of a larger difference overflows a float; a difference this large is a mismatch whatever its size
_EXP_CAP = 700.0

#: the fewest tokens whose 99th percentile is not their maximum: below it the p99 limit is not applied
#: (the maximum has a limit of its own), or one token of a short rollout would be held to the p99 bound
P99_MIN_TOKENS = 100


def _ratio(diff: float) -> float:
    return math.exp(min(diff, _EXP_CAP))


@dataclass
class DeltaStats:
    """d = logp_trainer - logp_rollout per sampled token: |d| (δ) and the importance ratios exp(d).

    ``mean_log_ratio`` is the signed mean of d: a shift of the trainer's distribution against the
    engine's shows here with its sign. ``kl_k3`` is the k3 estimate of KL(rollout || trainer),
    mean(r - 1 - log r) with r = exp(d), which is never negative -- valid only where the ids were
    sampled from the distribution the recorded logprobs describe (None elsewhere, e.g. re-rendered
    tokens nobody sampled).
    """

    tokens: int = 0
    delta_max: float = 0.0
    delta_mean: float = 0.0
    delta_p99: float = 0.0
    ratio_min: float = 1.0
    ratio_max: float = 1.0
    share_within: float = 1.0  # share of ratios within 1 ± epsilon
    mean_log_ratio: float = 0.0
    kl_k3: float | None = 0.0

    @classmethod
    def of(cls, rollout: Sequence[float], trainer: Sequence[float], epsilon: float, *,
           sampled: bool = True) -> DeltaStats:
        """The statistics over paired logprobs; ``sampled``: the ids were drawn from the rollout's
        recorded distribution (the k3 estimate is only an estimate of the KL then)."""
        if len(rollout) != len(trainer):
            raise ValueError(f"{len(rollout)} rollout logprobs against {len(trainer)} trainer logprobs")
        if not rollout:
            return cls(kl_k3=0.0 if sampled else None)
        diffs = [t - r for r, t in zip(rollout, trainer)]
        deltas = sorted(abs(d) for d in diffs)
        ratios = [_ratio(d) for d in diffs]
        k3 = sum(r - 1.0 - min(d, _EXP_CAP) for r, d in zip(ratios, diffs)) / len(diffs) if sampled else None
        return cls(
            tokens=len(diffs), delta_max=deltas[-1], delta_mean=sum(deltas) / len(deltas),
            delta_p99=deltas[min(len(deltas) - 1, int(math.ceil(0.99 * len(deltas))) - 1)],
            ratio_min=min(ratios), ratio_max=max(ratios),
            share_within=sum(1 for r in ratios if abs(r - 1.0) <= epsilon) / len(ratios),
            mean_log_ratio=sum(diffs) / len(diffs), kl_k3=k3,
        )


@dataclass(frozen=True)
class LimitFailure:
    """One limit a check broke, with the numbers."""

    limit: str  # the Limits field's name
    value: float
    bound: float

    @property
    def text(self) -> str:
        label, relation = _LABELS[self.limit]
        return f"{label} {self.value:.4g} {relation} {self.bound:g}"


_LABELS: dict[str, tuple[str, str]] = {
    "delta_mean": ("mean |δ|", ">"), "delta_p99": ("p99 |δ|", ">"), "delta_max": ("max |δ|", ">"),
    "share_within": ("share of ratios within 1±ε", "<"), "kl_k3": ("KL(rollout||trainer) k3", ">"),
    "tokens": ("scored tokens", "<"),
}


@dataclass(frozen=True)
class Limits:
    """What a step-0 check must meet (δ = |logp_trainer - logp_rollout| in nats, per sampled token).

    The defaults are derived in ``docs/real-engine.md`` ("Step-0 limits") from the floor measured on the
    real engine's unconstrained records (vLLM bf16 against transformers fp32 and bf16): each sits at
    about twice the worst measured value or more, and one to three orders of magnitude below a mismatch.
    """

    delta_mean: float = 0.03
    delta_p99: float = 0.25
    delta_max: float = 1.0
    #: minimum share of ratios exp(d) within 1 ± ``epsilon``
    share_within: float = 0.75
    epsilon: float = 0.05
    kl_k3: float = 2e-3

    def __post_init__(self) -> None:
        for name in ("delta_mean", "delta_p99", "delta_max", "epsilon", "kl_k3"):
            if not getattr(self, name) > 0:
                raise ValueError(f"the {name} limit must be positive, not {getattr(self, name)}")
        if not 0.0 <= self.share_within <= 1.0:
            raise ValueError(f"share_within is a share (0..1), not {self.share_within}")

    def failures(self, stats: DeltaStats) -> list[LimitFailure]:
        """The limits ``stats`` breaks (empty: it meets them all). A check over no token breaks one:
        a proof over nothing is no proof. Under ``P99_MIN_TOKENS`` tokens the p99 is the maximum, and only
        the maximum's limit applies to it."""
        if stats.tokens == 0:
            return [LimitFailure("tokens", 0, 1)]
        names = ("delta_mean", "delta_p99", "delta_max") if stats.tokens >= P99_MIN_TOKENS else ("delta_mean", "delta_max")
        out = [LimitFailure(name, getattr(stats, name), getattr(self, name))
               for name in names if getattr(stats, name) > getattr(self, name)]
        if stats.share_within < self.share_within:
            out.append(LimitFailure("share_within", stats.share_within, self.share_within))
        if stats.kl_k3 is not None and stats.kl_k3 > self.kl_k3:
            out.append(LimitFailure("kl_k3", stats.kl_k3, self.kl_k3))
        return out

    def summary(self) -> str:
        """The limits in one line (what a verdict names when it fails)."""
        return (f"mean |δ| ≤ {self.delta_mean:g}, p99 |δ| ≤ {self.delta_p99:g}, max |δ| ≤ {self.delta_max:g}, "
                f"≥ {self.share_within:.0%} of ratios within 1±{self.epsilon:g}, k3 KL ≤ {self.kl_k3:g}; "
                f"p99 from {P99_MIN_TOKENS} tokens")


#: The documented limits (``docs/real-engine.md``, "Step-0 limits")
DEFAULT_LIMITS = Limits()
