"""One GRPO update from recorded rollouts: group advantages, the clipped token-level loss, a step.

The samples are the assembler's rows (``HarnessTrace``) exactly as recorded: the ids the engine
saw and sampled, the mask that says which ids are the policy's, and the engine's logprobs of them
as the old policy's. Nothing is re-tokenized or re-rendered, so the importance ratio
``exp(logp_trainer - logp_rollout)`` of the first step is 1 up to numerical noise -- which this
module reports before it steps (a sample that is not what the engine sampled shows there first).

Deliberately small: the objective is GRPO's (group-normalized advantages, PPO's clipped ratio,
tokens averaged over the group as DAPO does), on the CPU, updating only the model's last decoder
layers so a step fits a 2-core machine. It is the smallest trainer that closes the loop
(``train_loop.py``), not a replacement for TRL.

Trainer-side only (torch + transformers); the recorder never imports it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from openenv_harness.assembly.trace import HarnessTrace


@dataclass
class TrainSample:
    """One row to learn from: its ids, where the response starts, the mask, the old logprobs, A."""

    input_ids: list[int]
    response_start: int
    loss_mask: list[int]
    old_logprobs: list[float]
    advantage: float
    session_id: str = ""

    @property
    def trainable(self) -> int:
        return sum(self.loss_mask)


@dataclass
class StepReport:
    """What one update did, in numbers a person can check."""

    samples: int
    trainable_tokens: int
    advantages: list[float]
    loss: float
    grad_norm: float
    #: exp(logp_trainer - logp_rollout) over the trainable tokens before the step (step 0: ~1)
    ratio_min: float
    ratio_max: float
    ratio_mean: float
    #: tokens whose ratio left [1 - clip, 1 + clip] (the clip is active on them)
    clipped_tokens: int
    trained_parameters: int
    learning_rate: float
    notes: list[str] = field(default_factory=list)


def group_advantages(rewards: Sequence[float], *, eps: float = 1e-6) -> list[float]:
    """GRPO's advantage: each reward less the group's mean, over the group's standard deviation.

    A group whose rewards all tie carries no signal: every advantage is 0 (and the step moves
    nothing), which is reported rather than hidden behind a division by ~0.
    """
    if not rewards:
        raise ValueError("a group needs at least one reward")
    values = [float(r) for r in rewards]
    if any(not math.isfinite(v) for v in values):
        raise ValueError(f"rewards must be finite numbers, got {list(rewards)!r}")
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    if std < eps:
        return [0.0 for _ in values]
    return [(v - mean) / std for v in values]


def samples_from_traces(traces: Sequence[HarnessTrace], advantage: float, session_id: str = "") -> list[TrainSample]:
    """The rows of one rollout, each with the rollout's advantage. Rows without a trainable id are dropped
    (they carry no gradient); logprobs under mask 0 are never read."""
    out: list[TrainSample] = []
    for trace in traces:
        if not any(trace.loss_mask):
            continue
        out.append(TrainSample(list(trace.prompt_ids) + list(trace.response_ids), len(trace.prompt_ids),
                               list(trace.loss_mask), list(trace.response_logprobs), float(advantage),
                               session_id or (trace.metadata.session_id or "")))
    return out


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - the trainer extra provides it
        raise ImportError("training needs torch and transformers (pip install 'openenv-harness[trainer]')") from exc
    return torch


def train_last_layers(model: Any, layers: int) -> list[Any]:
    """Freeze the model except its last ``layers`` decoder layers (and the final norm); return what trains.

    Backward then stops at the first trainable layer, so a step costs one forward pass over the
    sequence plus the backward of those layers: what makes an update affordable on a CPU.
    """
    base = model.base_model
    blocks = getattr(base, "layers", None)
    if blocks is None:
        raise ValueError(f"{type(model).__name__} has no decoder layers at base_model.layers")
    if not 1 <= layers <= len(blocks):
        raise ValueError(f"train between 1 and {len(blocks)} layers, got {layers}")
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    trained: list[Any] = []
    for module in [*blocks[len(blocks) - layers:], getattr(base, "norm", None)]:
        if module is None:
            continue
        for parameter in module.parameters():
            parameter.requires_grad_(True)
            trained.append(parameter)
    return trained


def response_logprobs(model: Any, sample: TrainSample) -> Any:
    """log p(id | everything before it) at each response position, as a tensor (with grad where the
    model has trainable parameters). Logits are computed only at response positions: the
    vocabulary-sized projection of a several-thousand-id prompt would not fit in memory."""
    torch = _torch()
    ids = torch.tensor([sample.input_ids])
    hidden = model.base_model(input_ids=ids).last_hidden_state[0]
    start = sample.response_start
    if start < 1:
        raise ValueError("a response needs at least one prompt id before it")
    # position p predicts id p + 1: the response's ids are predicted from positions start-1 .. end-2
    predicting = hidden[start - 1:len(sample.input_ids) - 1]
    logits = model.get_output_embeddings()(predicting).float()
    targets = ids[0, start:]
    return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]


def grpo_step(model: Any, optimizer: Any, samples: Sequence[TrainSample], *, clip: float = 0.2,
              max_grad_norm: float = 1.0) -> StepReport:
    """One clipped-GRPO update over a group's samples (gradients accumulated sample by sample).

    loss = -sum_t min(r_t A, clip(r_t, 1-clip, 1+clip) A) / T over the trainable tokens t of every
    sample (T: their count), r_t = exp(logp_trainer - logp_rollout), A the sample's advantage.
    """
    torch = _torch()
    if not samples:
        raise ValueError("no sample carries a trainable token: nothing to train on")
    total = sum(s.trainable for s in samples)
    trained = [p for group in optimizer.param_groups for p in group["params"]]
    optimizer.zero_grad(set_to_none=True)
    model.train()
    loss_sum = 0.0
    ratios: list[float] = []
    clipped = 0
    for sample in samples:
        logp = response_logprobs(model, sample)
        mask = torch.tensor(sample.loss_mask, dtype=logp.dtype)
        old = torch.tensor(sample.old_logprobs, dtype=logp.dtype)
        ratio = torch.exp(logp - old)
        advantage = torch.tensor(sample.advantage, dtype=logp.dtype)
        objective = torch.minimum(ratio * advantage, torch.clamp(ratio, 1 - clip, 1 + clip) * advantage)
        loss = -(objective * mask).sum() / total
        loss.backward()
        loss_sum += float(loss.detach())
        kept = ratio.detach()[mask.bool()]
        ratios.extend(kept.tolist())
        clipped += int(((kept < 1 - clip) | (kept > 1 + clip)).sum())
    grad_norm = float(torch.nn.utils.clip_grad_norm_(trained, max_grad_norm))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    notes = []
    if all(s.advantage == 0 for s in samples):
        notes.append("every advantage is 0 (the group's rewards tie): the step moved nothing")
    return StepReport(
        samples=len(samples), trainable_tokens=total, advantages=[s.advantage for s in samples], loss=loss_sum,
        grad_norm=grad_norm, ratio_min=min(ratios), ratio_max=max(ratios), ratio_mean=sum(ratios) / len(ratios),
        clipped_tokens=clipped, trained_parameters=sum(p.numel() for p in trained),
        learning_rate=float(optimizer.param_groups[0]["lr"]), notes=notes,
    )
