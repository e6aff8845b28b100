"""One GRPO update from recorded rollouts: group advantages, the clipped token-level loss, a step.

The samples are the assembler's rows (``HarnessTrace``) exactly as recorded: the ids the engine
saw and sampled, the mask that says which ids are the policy's, and the engine's logprobs of them
as the old policy's. Nothing is re-tokenized or re-rendered, so the importance ratio
``exp(logp_trainer - logp_rollout)`` of the first step is 1 up to numerical noise -- which this
module reports before it steps (a sample that is not what the engine sampled shows there first).

The ratio is only meaningful when both logprobs are of the distribution the engine sampled from:
each sample carries the temperature its logits are divided by (``trainer/sampling.py`` decides it
from the records' provenance, and refuses records whose distribution cannot be reproduced).

Deliberately small: the objective is GRPO's (group-normalized advantages, PPO's clipped ratio,
tokens averaged over the group as DAPO does), on the CPU, updating only the model's last decoder
layers so a step fits a 2-core machine. It is the smallest trainer that closes the loop
(``train_loop.py``; the state a multi-step loop keeps is ``state.py``), not a replacement for TRL.

Trainer-side only (torch + transformers); the recorder never imports it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from openenv_harness.assembly.trace import HarnessTrace
from openenv_harness.trainer.sampling import RecordedSampling, UnreproducibleSampling


@dataclass
class TrainSample:
    """One row to learn from: its ids, where the response starts, the mask, the old logprobs, A.

    ``temperature_divisor`` is what the trainer divides its logits by so that its logprobs are the
    recorded quantity (``RecordedSampling.temperature_divisor``). Values under mask 0 are never read
    (a filler there may be anything, -inf and NaN included); under mask 1 they must be finite.
    """

    input_ids: list[int]
    response_start: int
    loss_mask: list[int]
    old_logprobs: list[float]
    advantage: float
    session_id: str = ""
    temperature_divisor: float = 1.0

    def __post_init__(self) -> None:
        response = len(self.input_ids) - self.response_start
        if self.response_start < 1:
            raise ValueError("a response needs at least one prompt id before it")
        if not len(self.loss_mask) == len(self.old_logprobs) == response:
            raise ValueError(f"sample {self.session_id or '?'}: {response} response ids, {len(self.loss_mask)} mask "
                             f"values and {len(self.old_logprobs)} old logprobs: they must align")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError(f"sample {self.session_id or '?'}: the loss mask holds values other than 0 and 1")
        bad = [i for i, (m, lp) in enumerate(zip(self.loss_mask, self.old_logprobs)) if m and not math.isfinite(lp)]
        if bad:
            raise ValueError(f"sample {self.session_id or '?'}: old logprob {self.old_logprobs[bad[0]]} under mask 1 "
                             f"at response position {bad[0]} ({len(bad)} such): a trainable token needs its real logprob")
        if not math.isfinite(self.advantage):
            raise ValueError(f"sample {self.session_id or '?'}: advantage {self.advantage} is not a finite number")
        if not (math.isfinite(self.temperature_divisor) and self.temperature_divisor > 0):
            raise ValueError(f"sample {self.session_id or '?'}: temperature divisor {self.temperature_divisor} must "
                             "be a positive number")

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
    #: tokens whose ratio left [1 - clip, 1 + clip]
    clipped_tokens: int
    trained_parameters: int
    learning_rate: float
    notes: list[str] = field(default_factory=list)
    #: of them, the tokens whose gradient the clip removed: r > 1 + clip with A > 0, r < 1 - clip with A < 0
    gradient_clipped_tokens: int = 0
    #: the logit divisors the samples were scored with (1.0: plain log-softmax)
    temperature_divisors: list[float] = field(default_factory=list)
    #: False when every advantage was 0: the optimizer was not stepped (its state is unchanged)
    stepped: bool = True


StdKind = Literal["population", "sample"]


def group_advantages(rewards: Sequence[float], *, std: StdKind = "population", eps: float = 1e-8) -> list[float]:
    """GRPO's advantage: each reward less the group's mean, over the group's standard deviation + ``eps``.

    The defaults are TRL 1.16's AsyncGRPO (its rollout worker, the path that trains on loop-owning
    agents' records): the population standard deviation (no Bessel correction) and eps 1e-8.
    ``std="sample", eps=1e-4`` gives TRL's ``GRPOTrainer`` with ``scale_rewards="group"`` (Bessel's
    correction, eps 1e-4). One difference from both: an unscored rollout is not given advantage 0
    here, it is refused (the loop leaves unscored rollouts out of the group before it asks).

    A group whose rewards all tie carries no signal: every advantage is exactly 0 (and the step
    moves nothing), which is reported rather than left to a mean's rounding.
    """
    if not rewards:
        raise ValueError("a group needs at least one reward")
    values = [float(r) for r in rewards]
    if any(not math.isfinite(v) for v in values):
        raise ValueError(f"rewards must be finite numbers, got {list(rewards)!r}")
    if std not in ("population", "sample"):
        raise ValueError(f"std is 'population' or 'sample', got {std!r}")
    if not eps > 0:
        raise ValueError(f"eps must be positive, got {eps}")
    if max(values) == min(values):
        return [0.0 for _ in values]
    mean = sum(values) / len(values)
    degrees = len(values) - (1 if std == "sample" else 0)
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / degrees)
    return [(v - mean) / (spread + eps) for v in values]


def row_divisor(trace: HarnessTrace, sampling: Mapping[str, RecordedSampling], where: str) -> float:
    """The logit divisor of one row: every call with a trainable token in it must have been sampled
    (and its logprobs recorded) under one divisor the trainer can reproduce; otherwise it is refused."""
    trainable = [s for s in trace.metadata.segments if s.trainable_tokens]
    if not trainable:
        raise UnreproducibleSampling(f"{where}: trainable ids but no segment says which call sampled them")
    divisors: dict[str, float] = {}
    for segment in trainable:
        recorded = sampling.get(segment.node_id)
        if recorded is None:
            raise UnreproducibleSampling(f"{where}: no recorded sampling for call {segment.node_id} (pass the "
                                         "records this row was assembled from)")
        problems = recorded.problems()
        if problems:
            raise UnreproducibleSampling(f"{where}: call {segment.node_id} cannot be scored as it was sampled: "
                                         + "; ".join(problems))
        divisors[segment.node_id] = recorded.temperature_divisor
    if len(set(divisors.values())) > 1:
        raise UnreproducibleSampling(f"{where}: its calls were sampled at different temperatures ("
                                     + ", ".join(f"{n}: {d:g}" for n, d in divisors.items())
                                     + "); one row is scored under one temperature")
    return next(iter(divisors.values()))


def samples_from_traces(traces: Sequence[HarnessTrace], advantage: float, session_id: str = "", *,
                        sampling: Mapping[str, RecordedSampling]) -> list[TrainSample]:
    """The rows of one rollout, each with the rollout's advantage and the temperature its calls were
    sampled at (``sampling``: the records' ``RecordedSampling`` by node id, as ``require_reproducible``
    returns it). Rows without a trainable id are dropped (they carry no gradient); logprobs under
    mask 0 are never read. A row whose sampling the trainer cannot reproduce raises
    ``UnreproducibleSampling``."""
    out: list[TrainSample] = []
    for index, trace in enumerate(traces):
        if not any(trace.loss_mask):
            continue
        session = session_id or (trace.metadata.session_id or "")
        divisor = row_divisor(trace, sampling, f"row {index} of session {session or '?'}")
        out.append(TrainSample(list(trace.prompt_ids) + list(trace.response_ids), len(trace.prompt_ids),
                               list(trace.loss_mask), list(trace.response_logprobs), float(advantage), session,
                               divisor))
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
    model has trainable parameters), from the logits divided by the sample's temperature divisor.
    Logits are computed only at response positions: the vocabulary-sized projection of a
    several-thousand-id prompt would not fit in memory."""
    torch = _torch()
    ids = torch.tensor([sample.input_ids], device=next(model.parameters()).device)
    hidden = model.base_model(input_ids=ids).last_hidden_state[0]
    start = sample.response_start
    # position p predicts id p + 1: the response's ids are predicted from positions start-1 .. end-2
    predicting = hidden[start - 1:len(sample.input_ids) - 1]
    logits = model.get_output_embeddings()(predicting).float()
    if sample.temperature_divisor != 1.0:
        logits = logits / sample.temperature_divisor
    targets = ids[0, start:]
    return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]


def grpo_step(model: Any, optimizer: Any, samples: Sequence[TrainSample], *, clip: float = 0.2,
              max_grad_norm: float = 1.0) -> StepReport:
    """One clipped-GRPO update over a group's samples (gradients accumulated sample by sample).

    loss = -sum_t min(r_t A, clip(r_t, 1-clip, 1+clip) A) / T over the trainable tokens t of every
    sample (T: their count over the whole group), r_t = exp(logp_trainer - logp_rollout), A the
    sample's advantage. The trainable positions are selected *before* the ratio is formed, so
    whatever fills the old logprobs under mask 0 never reaches ``exp`` nor the gradient. A gradient
    that is not finite is refused before the optimizer moves anything.
    """
    torch = _torch()
    if not samples:
        raise ValueError("no sample carries a trainable token: nothing to train on")
    if not 0 < clip < 1:
        raise ValueError(f"clip must be in (0, 1), got {clip}")
    total = sum(s.trainable for s in samples)
    if total == 0:
        raise ValueError("no sample carries a trainable token: nothing to train on")
    trained = [p for group in optimizer.param_groups for p in group["params"]]
    optimizer.zero_grad(set_to_none=True)
    model.train()
    loss_sum = 0.0
    ratios: list[float] = []
    clipped = 0
    gradient_clipped = 0
    try:
        for sample in samples:
            if not sample.trainable:
                continue
            logp = response_logprobs(model, sample)
            keep = [i for i, m in enumerate(sample.loss_mask) if m]
            new = logp[torch.tensor(keep, device=logp.device)]
            old = torch.tensor([sample.old_logprobs[i] for i in keep], dtype=logp.dtype, device=logp.device)
            ratio = torch.exp(new - old)
            advantage = float(sample.advantage)
            objective = torch.minimum(ratio * advantage, torch.clamp(ratio, 1 - clip, 1 + clip) * advantage)
            loss = -objective.sum() / total
            loss.backward()
            loss_sum += float(loss.detach())
            kept = ratio.detach()
            ratios.extend(kept.tolist())
            clipped += int(((kept < 1 - clip) | (kept > 1 + clip)).sum())
            gradient_clipped += int((kept > 1 + clip).sum()) if advantage > 0 else 0
            gradient_clipped += int((kept < 1 - clip).sum()) if advantage < 0 else 0
        grad_norm = float(torch.nn.utils.clip_grad_norm_(trained, max_grad_norm))
        if not math.isfinite(grad_norm):
            raise FloatingPointError(f"the gradient norm is {grad_norm}: the step is refused and no weight moved")
        # no advantage, no step: Adam would otherwise move the weights on its momentum from earlier steps
        stepped = any(s.advantage != 0 for s in samples)
        if stepped:
            optimizer.step()
    finally:
        optimizer.zero_grad(set_to_none=True)
        model.eval()
    notes = []
    if not stepped:
        notes.append("every advantage is 0 (the group's rewards tie): no step was taken, nothing moved")
    return StepReport(
        samples=len(samples), trainable_tokens=total, advantages=[s.advantage for s in samples], loss=loss_sum,
        grad_norm=grad_norm, ratio_min=min(ratios), ratio_max=max(ratios), ratio_mean=sum(ratios) / len(ratios),
        clipped_tokens=clipped, trained_parameters=sum(p.numel() for p in trained),
        learning_rate=float(optimizer.param_groups[0]["lr"]), notes=notes, gradient_clipped_tokens=gradient_clipped,
        temperature_divisors=sorted({s.temperature_divisor for s in samples}), stepped=stepped,
    )
