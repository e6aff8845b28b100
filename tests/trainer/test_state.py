"""The trainer's state across steps, on a tiny random Qwen2 model: fp32 masters that are never rounded,
Adam's state carried from one step to the next, a bf16 copy for the engine with every trained tensor
(the final norm included) changed where the change survives rounding, and a checkpoint that resumes
the same step -- or is refused, leaving the trainer as it was."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402

from openenv_harness.trainer.grpo import TrainSample  # noqa: E402
from openenv_harness.trainer.state import CheckpointError, TrainerState, weights_digest  # noqa: E402
from openenv_harness.trainer.verify import score_tokens  # noqa: E402

ROWS = [([3, 9, 11, 2, 40, 41, 13, 17], 1.0), ([3, 9, 11, 2, 50, 51, 52, 53], -1.0)]


@pytest.fixture(scope="module")
def base():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                                      tie_word_embeddings=True)
    model = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # weights as a bf16 checkpoint loaded in fp32 holds them: every value exact in bf16
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))
    return model


def _samples(model) -> list[TrainSample]:
    """The group's rows with the policy's current logprobs as the old ones (what the engine recorded)."""
    return [TrainSample(ids, 4, [1] * 4, score_tokens(model, ids[:4], ids[4:]), advantage) for ids, advantage in ROWS]


def _state(base, lr: float = 1e-2, layers: int = 1) -> TrainerState:
    return TrainerState.create(copy.deepcopy(base), layers=layers, learning_rate=lr)


def _rounded(tensors: dict) -> dict:
    return {n: t.to(torch.bfloat16).to(torch.float32) for n, t in tensors.items()}


def test_the_bf16_copy_for_the_engine_changes_every_trained_tensor_and_leaves_the_masters_fp32(base, tmp_path) -> None:
    state = _state(base)
    assert set(state.trained) == {n for n, _ in base.named_parameters() if n.startswith(("model.layers.2.", "model.norm."))}
    original = state.master_tensors()
    report = state.update(_samples(state.model))
    assert report.stepped and state.step == 1 and state.adam_steps == 1
    masters = state.master_tensors()
    assert weights_digest(masters) != weights_digest(_rounded(masters))  # the masters hold more than bf16 does
    state.save_served(tmp_path / "served")
    assert weights_digest(state.trained) == weights_digest(masters)  # writing the copy rounded nothing in place
    saved = load_file(str(tmp_path / "served" / "model.safetensors"))
    assert all(t.dtype == torch.bfloat16 for t in saved.values())
    for name in state.trained:
        assert torch.equal(saved[name], masters[name].to(torch.bfloat16)), name
        assert not torch.equal(saved[name], original[name].to(torch.bfloat16)), f"{name} did not change in the copy"
    assert torch.equal(saved["model.norm.weight"].float(), state.served_tensors()["model.norm.weight"].float())
    frozen = dict(base.named_parameters())
    for name, tensor in saved.items():
        if name not in state.trained and name in frozen:
            assert torch.equal(tensor, frozen[name].to(torch.bfloat16)), name
    assert "lm_head.weight" not in saved or torch.equal(saved["lm_head.weight"], saved["model.embed_tokens.weight"])


def test_a_norm_update_below_half_a_bf16_step_accumulates_in_the_master(base) -> None:
    """At lr 1e-4 a norm weight near 1 moves by ~1e-4 a step, under half of bf16's 2^-7 there: the copy
    for the engine shows no change at first, the master keeps it, and enough steps carry it past the
    rounding (a master rounded after each step would never move)."""
    state = _state(base, lr=1e-4)
    norm = state.trained["model.norm.weight"]
    start = norm.detach().clone()
    samples = _samples(state.model)
    state.update(samples)
    assert not torch.equal(norm, start)
    assert torch.equal(state.served_tensors()["model.norm.weight"].float(), start)
    steps = 1
    while torch.equal(state.served_tensors()["model.norm.weight"].float(), start) and steps < 200:
        state.update(samples)
        steps += 1
    assert steps > 5 and not torch.equal(state.served_tensors()["model.norm.weight"].float(), start)
    assert state.step == steps and state.adam_steps == steps


def test_the_second_step_starts_from_the_first_steps_masters_and_adam_state(base, tmp_path) -> None:
    """Step 2 from the fp32 masters with Adam's moments is what the loop does; a checkpoint written after
    step 1 resumes it bit for bit, while a step 2 from bf16-rounded masters, or with a fresh Adam, differs."""
    state = _state(base)
    state.update(_samples(state.model))
    after_first = state.master_tensors()
    state.save_checkpoint(tmp_path / "ckpt")
    assert state.master_digest() == weights_digest(after_first)  # saving touched nothing
    group = _samples(state.model)  # the next group, recorded by the engine at the new version
    state.update(group)
    assert state.step == 2 and state.adam_steps == 2
    expected = state.master_digest()

    resumed = _state(base)
    resumed.load_checkpoint(tmp_path / "ckpt")
    assert resumed.step == 1 and resumed.adam_steps == 1 and resumed.master_digest() == weights_digest(after_first)
    resumed.update(group)
    assert resumed.master_digest() == expected and resumed.step == 2

    rounded = _state(base)
    rounded.load_checkpoint(tmp_path / "ckpt")
    with torch.no_grad():
        for p in rounded.trained.values():
            p.copy_(p.to(torch.bfloat16))
    rounded.update(group)
    assert rounded.master_digest() != expected

    fresh = _state(base)
    with torch.no_grad():
        for name, p in fresh.trained.items():
            p.copy_(after_first[name])
    fresh.update(group)
    assert fresh.adam_steps == 1 and fresh.master_digest() != expected


def test_scoring_with_other_weights_swaps_them_back(base) -> None:
    state = _state(base)
    before = state.served_tensors()
    state.update(_samples(state.model))
    masters = state.master_digest()
    ids = ROWS[0][0]
    with state.scoring_with(before) as model:
        stale = score_tokens(model, ids[:4], ids[4:])
    as_served = weights_digest(_rounded(state.master_tensors()))
    with state.served() as model:
        served = score_tokens(model, ids[:4], ids[4:])
        assert weights_digest({n: p for n, p in model.named_parameters() if n in state.trained}) == as_served
    assert state.master_digest() == masters
    assert stale == pytest.approx(score_tokens(base, ids[:4], ids[4:]), abs=1e-6)
    assert max(abs(a - b) for a, b in zip(stale, served)) > 1e-3
    with pytest.raises(ValueError, match="no value for trained parameter"):
        with state.scoring_with({}):
            pass
    assert state.master_digest() == masters


def test_bad_checkpoints_are_refused_and_the_trainer_is_unchanged(base, tmp_path) -> None:
    state = _state(base)
    state.update(_samples(state.model))
    state.save_checkpoint(tmp_path / "good")
    other = _state(base, layers=2)
    other.update(_samples(other.model))
    other.save_checkpoint(tmp_path / "two-layers")

    target = _state(base)
    digest, adam = target.master_digest(), copy.deepcopy(target.optimizer.state_dict())
    with pytest.raises(CheckpointError, match="trainer_state.json missing"):
        target.load_checkpoint(tmp_path / "nothing")
    with pytest.raises(CheckpointError, match="trains 2 layer"):
        target.load_checkpoint(tmp_path / "two-layers")
    tampered = tmp_path / "tampered"
    tampered.mkdir()
    for f in (tmp_path / "good").iterdir():
        (tampered / f.name).write_bytes(f.read_bytes())
    masters = load_file(str(tampered / "master.safetensors"))
    masters["model.norm.weight"] = masters["model.norm.weight"] + 1.0
    save_file(masters, str(tampered / "master.safetensors"))
    with pytest.raises(CheckpointError, match="do not match their recorded digest"):
        target.load_checkpoint(tampered)
    meta = json.loads((tampered / "trainer_state.json").read_text())
    (tampered / "trainer_state.json").write_text(json.dumps({**meta, "step": "one"}))
    with pytest.raises(CheckpointError, match="not a trainer checkpoint"):
        target.load_checkpoint(tampered)
    assert target.master_digest() == digest and target.step == 0 and target.optimizer.state_dict() == adam
    target.load_checkpoint(tmp_path / "good")
    assert target.master_digest() == state.master_digest() and target.step == 1


def test_the_masters_must_be_fp32(base) -> None:
    with pytest.raises(ValueError, match="float32 master weights"):
        TrainerState.create(copy.deepcopy(base).to(torch.bfloat16), layers=1, learning_rate=1e-2)
    with pytest.raises(ValueError, match="learning rate"):
        TrainerState.create(copy.deepcopy(base), layers=1, learning_rate=float("nan"))


def test_tied_groups_take_no_step(base) -> None:
    state = _state(base)
    report = state.update([TrainSample(ids, 4, [1] * 4, [-1.0] * 4, 0.0) for ids, _ in ROWS])
    assert not report.stepped and state.step == 0 and state.adam_steps == 0


def test_a_checkpoint_of_the_step_count_and_learning_rate_reads_back(base, tmp_path: Path) -> None:
    state = _state(base, lr=3e-3)
    state.update(_samples(state.model))
    meta = json.loads((state.save_checkpoint(tmp_path / "c") / "trainer_state.json").read_text())
    assert meta["step"] == 1 and meta["learning_rate"] == 3e-3 and meta["layers"] == 1
    assert meta["parameters"]["model.norm.weight"] == [32] and meta["master_digest"] == state.master_digest()


def test_the_norms_can_train_at_their_own_rate(base, tmp_path: Path) -> None:
    """The norms form Adam's second group: its first step moves each weight by about its group's rate. The
    checkpoint keeps both rates, and a trainer with one group refuses it."""
    state = TrainerState.create(copy.deepcopy(base), layers=1, learning_rate=1e-4, norm_learning_rate=1e-2)
    norms = {"model.layers.2.input_layernorm.weight", "model.layers.2.post_attention_layernorm.weight",
             "model.norm.weight"}
    assert [g["lr"] for g in state.optimizer.param_groups] == [1e-4, 1e-2]
    assert {id(p) for p in state.optimizer.param_groups[1]["params"]} == {id(state.trained[n]) for n in norms}
    before = state.master_tensors()
    state.update(_samples(state.model))
    moved = {n: (p.detach() - before[n]).abs().max().item() for n, p in state.trained.items()}
    assert all(moved[n] == pytest.approx(1e-2, rel=0.05) for n in norms)
    assert all(moved[n] == pytest.approx(1e-4, rel=0.05) for n in state.trained if n not in norms)
    meta = json.loads((state.save_checkpoint(tmp_path / "c") / "trainer_state.json").read_text())
    assert (meta["learning_rate"], meta["norm_learning_rate"]) == (1e-4, 1e-2)
    again = TrainerState.create(copy.deepcopy(base), layers=1, learning_rate=1e-4, norm_learning_rate=1e-2)
    again.load_checkpoint(tmp_path / "c")
    assert again.master_digest() == state.master_digest() and again.adam_steps == 1
    single = _state(base)
    digest = single.master_digest()
    with pytest.raises(CheckpointError, match="optimizer's state .* does not fit"):
        single.load_checkpoint(tmp_path / "c")
    assert single.master_digest() == digest and single.step == 0 and single.adam_steps == 0
