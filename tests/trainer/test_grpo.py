"""One GRPO step, on a tiny random Qwen2 model: advantages, what the loss reads (only mask-1 tokens,
their recorded logprobs), which parameters train, and that a step moves the policy the advantage's way."""

from __future__ import annotations

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
from openenv_harness.trainer.verify import score_tokens  # noqa: E402


@pytest.fixture
def model():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    m = transformers.Qwen2ForCausalLM(config)
    m.eval()
    return m


def _sample(model, ids: list[int], start: int, mask: list[int], advantage: float) -> TrainSample:
    """A sample whose old logprobs are the model's own (step 0), 0.0 under mask 0 as the assembler writes them."""
    own = score_tokens(model, ids[:start], ids[start:])
    return TrainSample(ids, start, mask, [lp if m else 0.0 for lp, m in zip(own, mask)], advantage)


def test_advantages_are_normalized_and_a_tied_group_has_none() -> None:
    a = group_advantages([1.0, 0.0, 0.5, 0.5])
    assert math.isclose(sum(a), 0.0, abs_tol=1e-9) and a[0] > a[2] == a[3] > a[1]
    assert math.isclose(sum(x * x for x in a) / len(a), 1.0, rel_tol=1e-6)
    assert group_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="finite"):
        group_advantages([1.0, float("nan")])
    with pytest.raises(ValueError, match="at least one"):
        group_advantages([])


def test_only_the_last_layers_and_the_final_norm_train(model) -> None:
    trained = train_last_layers(model, 1)
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names and all(n.startswith("model.layers.2.") or n == "model.norm.weight" for n in names)
    assert sum(p.numel() for p in trained) == sum(p.numel() for n, p in model.named_parameters() if n in names)
    with pytest.raises(ValueError, match="between 1 and 3"):
        train_last_layers(model, 4)


def test_the_response_logprobs_are_the_scorers(model) -> None:
    ids = [3, 9, 11, 2, 40, 41, 13, 17]
    ours = response_logprobs(model, TrainSample(ids, 5, [1, 1, 1], [0.0] * 3, 0.0)).tolist()
    assert ours == pytest.approx(score_tokens(model, ids[:5], ids[5:]), abs=1e-5)


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
    assert report.trainable_tokens == 6 and report.clipped_tokens == 0 and report.notes == []


def test_mask_zero_tokens_and_their_logprobs_are_never_read(model) -> None:
    """The loss is the same whatever sits under mask 0 in the old logprobs (a constrained call's post-mask ones)."""
    train_last_layers(model, 1)
    ids = [3, 9, 11, 2, 40, 41, 13, 17]
    mask = [1, 0, 0, 1]
    a = _sample(model, ids, 4, mask, 1.0)
    b = TrainSample(a.input_ids, a.response_start, mask, [lp if m else -99.0 for lp, m in zip(a.old_logprobs, mask)], 1.0)
    losses = []
    for sample in (a, b):
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
        losses.append(grpo_step(model, optimizer, [sample]).loss)
    assert losses[0] == pytest.approx(losses[1]) and grpo_step(
        model, torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0), [a]).trainable_tokens == 2


def test_a_tied_group_moves_nothing_and_says_so(model) -> None:
    trained = train_last_layers(model, 1)
    snapshot = [p.detach().clone() for p in trained]
    samples = [_sample(model, [3, 9, 11, 2, 40, 41], 4, [1, 1], 0.0), _sample(model, [3, 9, 11, 2, 7, 8], 4, [1, 1], 0.0)]
    report = grpo_step(model, torch.optim.Adam(trained, lr=1e-2), samples)
    assert all(torch.equal(a, b) for a, b in zip(snapshot, trained))
    assert report.notes and "tie" in report.notes[0]


def test_rows_without_a_trainable_id_are_dropped() -> None:
    def trace(mask: list[int]) -> HarnessTrace:
        segment = Segment(node_id="s/0", offset=0, length=2, trainable_tokens=sum(mask))
        return HarnessTrace(prompt_ids=[1, 2], response_ids=[3, 4], loss_mask=mask,
                            response_logprobs=[-0.5 if m else 0.0 for m in mask],
                            metadata=TraceMetadata(session_id="s", chain_id=0, sample_index=0, strategy="split",
                                                   node_ids=["s/0"], segments=[segment]))

    samples = samples_from_traces([trace([0, 0]), trace([1, 0])], 0.5)
    assert len(samples) == 1 and samples[0].input_ids == [1, 2, 3, 4] and samples[0].response_start == 2
    assert samples[0].advantage == 0.5 and samples[0].session_id == "s"
    with pytest.raises(ValueError, match="nothing to train"):
        grpo_step(None, None, [])
