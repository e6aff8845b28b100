"""Fidelity numbers for a session, and the per-token logprob gap between trainer and rollout.

Why: a trainer needs to *see* how faithful its samples are -- how many steps continued exactly,
how many drifted or broke, and how much of the data it actually trains on -- and whether the
policy it optimises still matches the one that sampled (RFC 006 D4, D10).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from openenv_harness.assembly.calls import call_from_entry
from openenv_harness.assembly.chains import ChainGrouping
from openenv_harness.assembly.errors import AssemblyError
from openenv_harness.assembly.trace import HarnessTrace, Strategy


class Resolutions(BaseModel):
    """What the assembler did at each replay drift."""

    #: drifts that closed the sample (the split strategy).
    split: int = 0
    realigned: int = 0
    #: realign refused by the length gate; split instead.
    realign_gated: int = 0
    spliced: int = 0
    #: approximate impossible (no end-of-turn id found); split instead.
    splice_fallback: int = 0
    #: trainable sampled ids given up to realignment.
    lost_tokens: int = 0


class SessionStats(BaseModel):
    """Counts and ratios for one assembled session."""

    session_id: str | None
    strategy: Strategy
    calls: int = Field(description="agent calls used")
    excluded: dict[str, int] = Field(default_factory=dict, description="records left out, by reason")
    chains: int
    traces: int
    exact: int
    replay_drift: int
    breaks: int
    break_causes: dict[str, int] = Field(default_factory=dict)
    drift_tokens: int = Field(0, description="sampled ids not reproduced in the next prompt, summed")
    max_drift_tokens: int = 0
    resolutions: Resolutions = Field(default_factory=Resolutions)
    approximate_traces: int = 0
    trainable_tokens: int
    non_policy_tokens: int = Field(0, description="sampled ids whose logprobs are not the policy's (decoding "
                                   "constraint), counted once per sample holding them")
    non_policy_trainable_tokens: int = Field(0, description="of them, mask 1 (0 unless non_policy='keep')")
    response_tokens: int
    total_tokens: int = Field(description="prompt + response tokens over all traces")
    trainable_ratio: float | None = Field(description="mask-1 tokens / response tokens (None without responses)")
    trainable_ratio_all_tokens: float | None = Field(
        description="mask-1 tokens / all tokens; shows the cost of history repeated by splits"
    )
    eot_id: int | None = None


def session_stats(
    *,
    session_id: str | None,
    strategy: Strategy,
    calls: int,
    excluded: Mapping[str, int],
    grouping: ChainGrouping,
    traces: Sequence[HarnessTrace],
    resolutions: Resolutions,
    eot_id: int | None,
) -> SessionStats:
    kinds = Counter(t.kind for t in grouping.transitions)
    causes = Counter(t.cause for t in grouping.transitions if t.kind == "break")
    drifts = [t.drift_tokens for t in grouping.transitions if t.kind == "replay_drift"]
    trainable = sum(t.metadata.trainable_tokens for t in traces)
    response = sum(len(t.response_ids) for t in traces)
    total = response + sum(len(t.prompt_ids) for t in traces)
    return SessionStats(
        session_id=session_id,
        strategy=strategy,
        calls=calls,
        excluded=dict(excluded),
        chains=len(grouping.chains),
        traces=len(traces),
        exact=kinds["exact"],
        replay_drift=kinds["replay_drift"],
        breaks=kinds["break"],
        break_causes={str(k): v for k, v in causes.items()},
        drift_tokens=sum(drifts),
        max_drift_tokens=max(drifts, default=0),
        resolutions=resolutions,
        approximate_traces=sum(1 for t in traces if t.metadata.approximate),
        trainable_tokens=trainable,
        non_policy_tokens=sum(t.metadata.non_policy_tokens for t in traces),
        non_policy_trainable_tokens=sum(t.metadata.non_policy_trainable_tokens for t in traces),
        response_tokens=response,
        total_tokens=total,
        trainable_ratio=trainable / response if response else None,
        trainable_ratio_all_tokens=trainable / total if total else None,
        eot_id=eot_id,
    )


class LogprobDelta(BaseModel):
    """|logp_train - logp_rollout| over mask-1 positions (D10). None when nothing is trainable."""

    tokens: int
    max_abs: float | None
    mean_abs: float | None


def logprob_delta(
    trainer_logprobs: Sequence[float], rollout_logprobs: Sequence[float], mask: Sequence[int]
) -> LogprobDelta:
    """Per-token gap between the trainer's and the rollout's logprobs where ``mask`` is 1."""
    if not (len(trainer_logprobs) == len(rollout_logprobs) == len(mask)):
        raise AssemblyError(
            "logprob arrays are misaligned: "
            f"trainer={len(trainer_logprobs)} rollout={len(rollout_logprobs)} mask={len(mask)}"
        )
    gaps: list[float] = []
    for position, (train, rollout, flag) in enumerate(zip(trainer_logprobs, rollout_logprobs, mask, strict=True)):
        if not flag:
            continue
        if not (math.isfinite(train) and math.isfinite(rollout)):
            raise AssemblyError(f"non-finite logprob at position {position} (trainer {train!r}, rollout {rollout!r})")
        gaps.append(abs(train - rollout))
    if not gaps:
        return LogprobDelta(tokens=0, max_abs=None, mean_abs=None)
    return LogprobDelta(tokens=len(gaps), max_abs=max(gaps), mean_abs=math.fsum(gaps) / len(gaps))


def trace_logprob_delta(trace: HarnessTrace, trainer_logprobs: Sequence[float]) -> LogprobDelta:
    """δ for a trace; ``trainer_logprobs`` aligned with ``trace.response_ids``."""
    return logprob_delta(trainer_logprobs, trace.response_logprobs, trace.loss_mask)


def record_logprob_delta(entry: Mapping[str, Any], trainer_logprobs: Sequence[float]) -> LogprobDelta:
    """δ for one recorded call; ``trainer_logprobs`` aligned with its ``completion_token_ids``.

    Positions count when the record is trainable and its own ``loss_mask`` (if any) marks them.
    """
    call = call_from_entry(entry)
    rollout = [float(x) for x in entry["per_token_logps"]]
    return logprob_delta(trainer_logprobs, rollout, call.mask)


def summarize_deltas(deltas: Iterable[LogprobDelta]) -> LogprobDelta:
    """Combine several δ results (token-weighted mean, overall max)."""
    tokens = 0
    weighted = 0.0
    largest: float | None = None
    for delta in deltas:
        if delta.tokens == 0 or delta.mean_abs is None or delta.max_abs is None:
            continue
        tokens += delta.tokens
        weighted += delta.mean_abs * delta.tokens
        largest = delta.max_abs if largest is None else max(largest, delta.max_abs)
    if tokens == 0:
        return LogprobDelta(tokens=0, max_abs=None, mean_abs=None)
    return LogprobDelta(tokens=tokens, max_abs=largest, mean_abs=weighted / tokens)
