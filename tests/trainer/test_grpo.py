"""One GRPO step, on a tiny random Qwen2 model: advantages (as TRL computes them), what the loss reads
(only mask-1 tokens, their recorded logprobs, whatever fills mask 0), the clip on both sides off
ratio 1, the loss normalised over the group's trainable tokens, the recorded temperature applied,
which parameters train, and that a step moves the policy the advantage's way."""

from __future__ import annotations

import copy
import math

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from openenv_harness.assembly.trace import HarnessTrace, Segment, TraceMetadata  # noqa: E402
from openenv_harness.trainer.grpo import (  # noqa: E402
    TrainSample,
    group_advantages,
    grpo_step,
    response_logprobs,
    samples_from_traces,
    train_last_layers,
)
from openenv_harness.trainer.sampling import RecordedSampling, UnreproducibleSampling, require_reproducible  # noqa: E402
from openenv_harness.trainer.verify import score_tokens  # noqa: E402

IDS = [3, 9, 11, 2, 40, 41, 13, 17]
START = 4


@pytest.fixture
def model():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    m = transformers.Qwen2ForCausalLM(config)
    m.eval()
    return m


def _sample(model, ids: list[int], start: int, mask: list[int], advantage: float, *,
            ratios: list[float] | None = None, filler: float = 0.0) -> TrainSample:
    """A sample whose old logprobs are the model's own (step 0), or shifted so that the ratio of
    position i is ``ratios[i]``; ``filler`` under mask 0, as the assembler writes 0.0 there."""
    own = score_tokens(model, ids[:start], ids[start:])
    shifted = [lp - math.log(r) for lp, r in zip(own, ratios or [1.0] * len(own))]
    return TrainSample(ids, start, mask, [lp if m else filler for lp, m in zip(shifted, mask)], advantage)


def _delta(model, samples: list[TrainSample]) -> torch.Tensor:
    """What one plain gradient step (SGD, lr 1, no norm clipping) moves the last layer by: -grad of the loss."""
    m = copy.deepcopy(model)
    trained = train_last_layers(m, 1)
    before = [p.detach().clone() for p in trained]
    grpo_step(m, torch.optim.SGD(trained, lr=1.0), samples, max_grad_norm=1e9)
    return torch.cat([(p.detach() - b).flatten() for p, b in zip(trained, before)])


def test_advantages_are_trls() -> None:
    """The default is TRL 1.16 AsyncGRPO's rollout worker ((r - mean) / (population std + 1e-8)); with
    Bessel's correction and eps 1e-4 it is GRPOTrainer's scale_rewards="group" (TRL's own nanstd)."""
    from trl.trainer.utils import nanstd

    rewards = [1.0, 0.0, 0.5, 0.25]
    mean = sum(rewards) / 4
    population = math.sqrt(sum((r - mean) ** 2 for r in rewards) / 4)
    assert group_advantages(rewards) == pytest.approx([(r - mean) / (population + 1e-8) for r in rewards], rel=1e-12)
    t = torch.tensor(rewards, dtype=torch.float64)
    trainer = ((t - t.mean()) / (nanstd(t) + 1e-4)).tolist()  # nanstd's Bessel factor is float32
    assert group_advantages(rewards, std="sample", eps=1e-4) == pytest.approx(trainer, rel=1e-6)
    assert group_advantages(rewards, std="sample", eps=1e-4) != pytest.approx(group_advantages(rewards), rel=1e-3)
    a = group_advantages([1.0, 0.0, 0.5, 0.5])
    assert math.isclose(sum(a), 0.0, abs_tol=1e-9) and a[0] > a[2] == a[3] > a[1]
    # a tied group is exactly 0, even where the mean's rounding differs from every reward (0.1 x 3)
    assert group_advantages([0.1, 0.1, 0.1]) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="finite"):
        group_advantages([1.0, float("nan")])
    with pytest.raises(ValueError, match="at least one"):
        group_advantages([])
    with pytest.raises(ValueError, match="'population' or 'sample'"):
        group_advantages([1.0, 0.0], std="bessel")  # type: ignore[arg-type]


def test_only_the_last_layers_and_the_final_norm_train(model) -> None:
    trained = train_last_layers(model, 1)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names and all(n.startswith("model.layers.2.") or n == "model.norm.weight" for n in names)
    assert sum(p.numel() for p in trained) == sum(p.numel() for n, p in model.named_parameters() if n in names)
    with pytest.raises(ValueError, match="between 1 and 3"):
        train_last_layers(model, 4)


def test_the_response_logprobs_are_the_scorers(model) -> None:
    ours = response_logprobs(model, TrainSample(IDS, 5, [1, 1, 1], [0.0] * 3, 0.0)).tolist()
    assert ours == pytest.approx(score_tokens(model, IDS[:5], IDS[5:]), abs=1e-5)


def test_the_recorded_temperature_is_applied(model) -> None:
    """A sample drawn at T = 0.5 with processed logprobs is log_softmax(logits / 0.5): scored with its
    divisor the ratio is 1; scored with a plain log-softmax it is another policy's."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([IDS])).logits[0].float()
    expected = [torch.log_softmax(logits[START - 1 + i] / 0.5, dim=-1)[tok].item() for i, tok in enumerate(IDS[START:])]
    plain = score_tokens(model, IDS[:START], IDS[START:])
    hot = TrainSample(IDS, START, [1] * 4, expected, 1.0, temperature_divisor=0.5)
    with torch.no_grad():
        assert response_logprobs(model, hot).tolist() == pytest.approx(expected, abs=1e-5)
    assert max(abs(e - p) for e, p in zip(expected, plain)) > 0.05  # the test means something
    train_last_layers(model, 1)
    frozen = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
    at_temperature = grpo_step(model, frozen, [hot])
    assert at_temperature.ratio_min == pytest.approx(1.0, abs=1e-4) and at_temperature.ratio_max == pytest.approx(1.0, abs=1e-4)
    assert at_temperature.temperature_divisors == [0.5]
    ignored = grpo_step(model, frozen, [TrainSample(IDS, START, [1] * 4, expected, 1.0)])
    assert abs(ignored.ratio_max - ignored.ratio_min) > 0.05


def test_a_step_raises_the_logprobs_of_the_advantaged_rollout(model) -> None:
    train_last_layers(model, 2)
    good = _sample(model, [3, 9, 11, 2, 40, 41, 13], 4, [1, 1, 1], 1.0)
    bad = _sample(model, [3, 9, 11, 2, 50, 51, 52], 4, [1, 1, 1], -1.0)
    before = [response_logprobs(model, s).sum().item() for s in (good, bad)]
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    report = grpo_step(model, optimizer, [good, bad])
    after = [response_logprobs(model, s).sum().item() for s in (good, bad)]
    assert after[0] > before[0] and after[1] < before[1]
    # step 0: the trainer's logprobs are the rollout's, so every ratio is 1 and nothing is clipped
    assert report.ratio_min == pytest.approx(1.0, abs=1e-4) and report.ratio_max == pytest.approx(1.0, abs=1e-4)
    assert report.trainable_tokens == 6 and report.clipped_tokens == 0 and report.notes == [] and report.stepped


@pytest.mark.parametrize("ratio, advantage", [(1.5, 1.0), (0.5, -1.0)])
def test_the_clip_removes_the_gradient_on_its_side(model, ratio: float, advantage: float) -> None:
    """r > 1 + clip with A > 0, and r < 1 - clip with A < 0: the token's term is the constant clipped
    one, so its gradient is 0 -- the step is the other token's alone, over the group's 2 tokens."""
    both = _sample(model, IDS, START, [1, 1, 0, 0], advantage, ratios=[ratio, 1.0, 1.0, 1.0])
    other = _sample(model, IDS, START, [0, 1, 0, 0], advantage)
    moved = _delta(model, [both])
    assert moved.abs().max() > 1e-4
    assert torch.allclose(moved, _delta(model, [other]) / 2, rtol=1e-3, atol=1e-7)
    m = copy.deepcopy(model)
    train_last_layers(m, 1)
    report = grpo_step(m, torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.0), [both])
    assert report.clipped_tokens == 1 and report.gradient_clipped_tokens == 1
    assert (report.ratio_min, report.ratio_max) == pytest.approx(tuple(sorted((ratio, 1.0))), abs=1e-4)


@pytest.mark.parametrize("ratio, advantage", [(1.5, -1.0), (0.5, 1.0)])
def test_the_unclipped_side_keeps_its_gradient(model, ratio: float, advantage: float) -> None:
    """Off ratio 1 on the other side (r > 1 + clip with A < 0, r < 1 - clip with A > 0) the clip does not
    bind: the token's gradient is r x A x grad logp, and the step is the sum of both tokens' over 2."""
    both = _sample(model, IDS, START, [1, 1, 0, 0], advantage, ratios=[ratio, 1.0, 1.0, 1.0])
    first = _sample(model, IDS, START, [1, 0, 0, 0], advantage, ratios=[ratio, 1.0, 1.0, 1.0])
    second = _sample(model, IDS, START, [0, 1, 0, 0], advantage)
    alone = _delta(model, [first])
    assert alone.abs().max() > 1e-4
    assert torch.allclose(_delta(model, [both]), (alone + _delta(model, [second])) / 2, rtol=1e-3, atol=1e-7)
    m = copy.deepcopy(model)
    train_last_layers(m, 1)
    report = grpo_step(m, torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.0), [both])
    assert report.clipped_tokens == 1 and report.gradient_clipped_tokens == 0


def test_the_loss_is_averaged_over_the_groups_trainable_tokens(model) -> None:
    """3 tokens with A = 1 and 1 token with A = -1: loss -(3 - 1) / 4, and the step is the samples'
    own steps weighted by their token counts over 4 (not each sample's mean, averaged)."""
    three = _sample(model, IDS, START, [1, 1, 1, 0], 1.0)
    one = _sample(model, [3, 9, 11, 2, 50, 51, 52, 53], START, [0, 0, 1, 0], -1.0)
    m = copy.deepcopy(model)
    train_last_layers(m, 1)
    report = grpo_step(m, torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.0), [three, one])
    assert report.loss == pytest.approx(-0.5, abs=1e-4) and report.trainable_tokens == 4
    group = _delta(model, [three, one])
    assert torch.allclose(group, (3 * _delta(model, [three]) + _delta(model, [one])) / 4, rtol=1e-3, atol=1e-7)
    assert not torch.allclose(group, (_delta(model, [three]) + _delta(model, [one])) / 2, rtol=1e-2, atol=1e-6)


@pytest.mark.parametrize("filler", [float("-inf"), float("nan"), -99.0])
def test_fillers_under_mask_zero_are_never_read(model, filler: float) -> None:
    """-inf, NaN or any value in the old logprobs under mask 0: an Adam step at lr 1e-2 leaves the weights
    finite, moves them, and moves them exactly as the assembler's 0.0 fillers do."""
    mask = [1, 0, 0, 1]
    steps = []
    for value in (0.0, filler):
        m = copy.deepcopy(model)
        trained = train_last_layers(m, 1)
        before = [p.detach().clone() for p in trained]
        report = grpo_step(m, torch.optim.Adam(trained, lr=1e-2),
                           [_sample(model, IDS, START, mask, 1.0, ratios=[1.3, 1, 1, 0.9], filler=value),
                            _sample(model, [3, 9, 11, 2, 50, 51, 52, 53], START, mask, -1.0, filler=value)])
        assert math.isfinite(report.loss) and math.isfinite(report.grad_norm) and report.trainable_tokens == 4
        assert all(torch.isfinite(p).all() for p in trained)
        steps.append(torch.cat([(p.detach() - b).flatten() for p, b in zip(trained, before)]))
    assert steps[1].abs().max() > 1e-3 and torch.equal(steps[0], steps[1])


def test_bad_samples_are_refused_and_nothing_moves(model) -> None:
    with pytest.raises(ValueError, match="under mask 1 at response position 1"):
        TrainSample(IDS, START, [1, 1, 0, 0], [-0.5, float("nan"), 0.0, 0.0], 1.0)
    with pytest.raises(ValueError, match="must align"):
        TrainSample(IDS, START, [1, 1, 1], [-0.5] * 3, 1.0)
    with pytest.raises(ValueError, match="at least one prompt id"):
        TrainSample(IDS, 0, [1] * 8, [-0.5] * 8, 1.0)
    with pytest.raises(ValueError, match="temperature divisor"):
        TrainSample(IDS, START, [1] * 4, [-0.5] * 4, 1.0, temperature_divisor=0.0)
    # a finite but absurd old logprob with A < 0: the unclipped side's ratio overflows; refused before the step
    trained = train_last_layers(model, 1)
    snapshot = [p.detach().clone() for p in trained]
    absurd = _sample(model, IDS, START, [1, 1, 1, 1], -1.0, ratios=[1.0, 1.0, 1.0, 1.0])
    absurd.old_logprobs[0] = -1e30
    with pytest.raises(FloatingPointError, match="no weight moved"):
        grpo_step(model, torch.optim.Adam(trained, lr=1e-2), [absurd])
    assert all(torch.equal(a, b) for a, b in zip(snapshot, trained))
    assert all(p.grad is None for p in trained)


def test_a_tied_group_moves_nothing_and_says_so(model) -> None:
    trained = train_last_layers(model, 1)
    optimizer = torch.optim.Adam(trained, lr=1e-2)
    moving = [_sample(model, [3, 9, 11, 2, 40, 41], 4, [1, 1], 1.0), _sample(model, [3, 9, 11, 2, 7, 8], 4, [1, 1], -1.0)]
    assert grpo_step(model, optimizer, moving).stepped  # Adam now carries momentum
    snapshot = [p.detach().clone() for p in trained]
    tied = [_sample(model, [3, 9, 11, 2, 40, 41], 4, [1, 1], 0.0), _sample(model, [3, 9, 11, 2, 7, 8], 4, [1, 1], 0.0)]
    report = grpo_step(model, optimizer, tied)
    # no step at all: Adam's momentum from the step before would otherwise move the weights
    assert all(torch.equal(a, b) for a, b in zip(snapshot, trained))
    assert not report.stepped and report.notes and "tie" in report.notes[0]
    assert {int(optimizer.state[p]["step"]) for p in trained} == {1}


def _record(node: str, temperature: float, mode: str, **effective: float) -> dict:
    """A record's metadata as the recorder writes it (node id, provenance's effective sampling and logprobs mode)."""
    return {"metadata": {"node_id": node, "provenance": {
        "sampling_effective": {"temperature": temperature, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                               "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                               **effective},
        "sampling_unknown": [], "logprobs_mode": mode}}}


def _trace(masks: dict[str, list[int]], session: str = "s") -> HarnessTrace:
    """One row spanning the given calls (node id -> its sampled ids' mask), two ids each, after a 2-id prompt."""
    segments, mask = [], []
    for node, call_mask in masks.items():
        segments.append(Segment(node_id=node, offset=len(mask), length=len(call_mask), trainable_tokens=sum(call_mask)))
        mask.extend(call_mask)
    return HarnessTrace(prompt_ids=[1, 2], response_ids=list(range(3, 3 + len(mask))), loss_mask=mask,
                        response_logprobs=[-0.5 if m else 0.0 for m in mask],
                        metadata=TraceMetadata(session_id=session, chain_id=0, sample_index=0, strategy="split",
                                               node_ids=list(masks), segments=segments))


def test_rows_carry_their_records_temperature_and_rows_without_a_trainable_id_are_dropped() -> None:
    sampling = require_reproducible([_record("s/0", 1.0, "raw_logprobs"), _record("s/1", 0.5, "processed_logprobs"),
                                     _record("s/2", 0.5, "processed_logprobs")])
    samples = samples_from_traces([_trace({"s/0": [0, 0]}), _trace({"s/0": [1, 0]}),
                                   _trace({"s/1": [1, 1], "s/2": [0, 1]})], 0.5, sampling=sampling)
    assert len(samples) == 2 and samples[0].input_ids == [1, 2, 3, 4] and samples[0].response_start == 2
    assert samples[0].advantage == 0.5 and samples[0].session_id == "s"
    assert [s.temperature_divisor for s in samples] == [1.0, 0.5]
    # a call without a trainable id does not set the row's temperature
    assert samples_from_traces([_trace({"s/0": [0, 0], "s/1": [1, 1]})], 1.0, sampling=sampling)[0].temperature_divisor == 0.5
    with pytest.raises(ValueError, match="nothing to train"):
        grpo_step(None, None, [])


def test_rows_the_trainer_cannot_reproduce_are_refused() -> None:
    mixed = require_reproducible([_record("s/0", 0.5, "processed_logprobs"), _record("s/1", 0.7, "processed_logprobs")])
    with pytest.raises(UnreproducibleSampling, match="different temperatures .*s/0: 0.5, s/1: 0.7"):
        samples_from_traces([_trace({"s/0": [1, 1], "s/1": [1, 0]})], 1.0, sampling=mixed)
    with pytest.raises(UnreproducibleSampling, match="no recorded sampling for call s/9"):
        samples_from_traces([_trace({"s/9": [1, 1]})], 1.0, sampling=mixed)
    # raw logprobs at T = 0.7 are the model's before temperature: refused by the records' check ...
    with pytest.raises(UnreproducibleSampling, match="raw"):
        require_reproducible([_record("s/0", 0.7, "raw_logprobs")])
    # ... and by the rows, whoever built the sampling map (truncation likewise)
    unchecked = {"s/0": RecordedSampling.of(_record("s/0", 0.7, "raw_logprobs")),
                 "s/1": RecordedSampling.of(_record("s/1", 1.0, "raw_logprobs", top_k=20))}
    with pytest.raises(UnreproducibleSampling, match="call s/0 cannot be scored as it was sampled: .*raw"):
        samples_from_traces([_trace({"s/0": [1, 1]})], 1.0, sampling=unchecked)
    with pytest.raises(UnreproducibleSampling, match="top_k=20"):
        samples_from_traces([_trace({"s/1": [1, 1]})], 1.0, sampling=unchecked)
