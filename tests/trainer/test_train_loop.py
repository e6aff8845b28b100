"""The loop's pieces that need no real engine: the reward, what two assemblers must agree on, the
report's verdict, the sync's refusal of an engine that cannot reload weights, the refusal of a
temperature whose logprobs the engine does not record (before any rollout), the step-0 check at the
records' temperature, and the CLI's errors (each one line, non-zero, before anything starts). The
whole loop runs in the real-engine tier (``tests/real_engine/test_real_train_loop.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from openenv_harness.recorder import RecorderClient
from openenv_harness.testing.engine import EngineConfig, EngineServer
from openenv_harness.sandbox.base import SandboxError
from openenv_harness.sandbox.choose import LOCAL_SANDBOX_LIMITS
from openenv_harness.trainer.grpo import StepReport
from openenv_harness.trainer.sampling import TRAINING_POLICY, RecordedSampling, UnreproducibleSampling
from openenv_harness.trainer.train_loop import (
    FULL_VOCABULARY,
    LoopReport,
    LoopSettings,
    RolloutSummary,
    TrainLoop,
    shaped_reward,
    trainable_view,
)
from openenv_harness.trainer.verify import DeltaStats
from openenv_harness.trainer.weight_sync import DiskWeightSync, SyncReport, WeightSyncError


def _settings(**kw) -> LoopSettings:
    return LoopSettings(engine_url="http://e", recorder_url="http://r", admin_token="t", model="m",
                        model_dir=Path("/m"), workdir=Path("/w"), **kw)


def test_the_reward_is_the_verdict_plus_the_unused_budget_and_unscored_stays_none() -> None:
    s = _settings(max_tokens=100, brevity=0.5)
    assert shaped_reward(0.0, 100, 1, s) == 0.0
    assert shaped_reward(0.0, 25, 1, s) == pytest.approx(0.375)
    assert shaped_reward(1.0, 50, 2, s) == pytest.approx(1.375)  # the budget is per call
    assert shaped_reward(1.0, 500, 1, s) == 1.0
    assert shaped_reward(None, 10, 1, s) is None


def test_the_trainable_view_is_position_id_and_logprob_under_mask_one() -> None:
    ids = [7, 8, 9, 10, 11]
    assert trainable_view(ids, [0, 1, 1], [0.0, -0.25, -1.5], offset=2) == [(3, 10, -0.25), (4, 11, -1.5)]
    # a full-length mask (TRL's rows) and a response-only one (the assembler's) agree on the same tokens
    assert trainable_view(ids, [0, 0, 0, 1, 1], [0.0, 0.0, 0.0, -0.25, -1.5]) == trainable_view(
        ids, [0, 1, 1], [0.0, -0.25, -1.5], offset=2)


def _stats(mean: float, mean_log_ratio: float = 0.0) -> DeltaStats:
    """Statistics whose every figure scales with the mean |delta| (a mismatch moves them all)."""
    return DeltaStats(tokens=100, delta_max=mean * 8, delta_mean=mean, delta_p99=mean * 5,
                      share_within=0.95 if mean < 0.02 else 0.6, mean_log_ratio=mean_log_ratio, kl_k3=mean * mean)


def _report(after_mean: float, stale_mean: float, after_versions: list[int] | None = None,
            before_mean: float = 0.01) -> LoopReport:
    rollout = RolloutSummary("s", 0, [0], 0.0, 0.3, 1, 10, 1, 10, True)
    later = RolloutSummary("t", 2, after_versions or [1], 0.0, 0.3, 1, 10, 1, 10, True)
    step = StepReport(2, 20, [1.0, -1.0], 0.1, 1.0, 0.9, 1.1, 1.0, 0, 100, 1e-4)
    return LoopReport({}, 0, 1, [rollout], step, SyncReport(0, 1, "/w"), [later], _stats(before_mean),
                      _stats(after_mean), _stats(stale_mean, mean_log_ratio=0.3))


def test_the_report_proves_the_loop_only_when_every_point_holds() -> None:
    """The checks are held to the step-0 limits ``trace verify`` applies (trainer/limits.py), not to a
    multiple of the run's own floor."""
    assert _report(0.009, 0.3).problems() == []
    # the new weights are not what the engine serves: the limit and the numbers are named
    [problem] = _report(0.05, 0.3).problems()
    assert "the new weights do not score the new records within the step-0 limits (mean |δ| 0.05 > 0.03" in problem
    # the update was too small to tell the weights apart: the stale weights also meet the limits
    assert "stale" in _report(0.01, 0.015).problems()[0]
    # outside the limits but no further than the new weights: not told apart either
    assert not _report(0.012, 0.02).stale_detected
    assert "version 1" in _report(0.01, 0.3, [0, 1]).problems()[0]  # a rollout straddled the sync
    # records at version v that the version-v weights do not verify: nothing after them proves anything
    assert "the version 0 weights do not score the version 0 records" in _report(0.009, 0.3, before_mean=0.1).problems()[0]


def test_an_engine_that_cannot_reload_weights_is_refused_before_the_loop(tmp_path: Path) -> None:
    engine = EngineServer(EngineConfig(dev_mode=False)).start()  # a vLLM without VLLM_SERVER_DEV_MODE
    try:
        sync = DiskWeightSync(RecorderClient("http://127.0.0.1:9", "t"), engine.url)
        with pytest.raises(WeightSyncError, match="does not serve /collective_rpc, /reset_prefix_cache"):
            sync.check()
        with pytest.raises(WeightSyncError, match="no weights folder"):
            sync.reload(tmp_path / "missing")
    finally:
        engine.stop()
    with pytest.raises(WeightSyncError, match="no engine answers"):
        DiskWeightSync(RecorderClient("http://127.0.0.1:9", "t"), "http://127.0.0.1:9").check()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "openenv_harness.cli", "train-demo", *args], capture_output=True,
                          text=True, timeout=120)


def test_the_cli_says_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    done = _cli("--engine-url", "http://127.0.0.1:9")
    assert done.returncode == 2 and "--engine-url needs --model and --model-dir" in done.stderr
    done = _cli("--group", "4", "--max-group", "3")
    assert done.returncode == 2 and "--max-group 3 is smaller than --group 4" in done.stderr
    done = _cli("--engine-url", "http://127.0.0.1:9", "--model", "m", "--model-dir", str(tmp_path))
    assert done.returncode == 2 and "no model folder" in done.stderr
    (tmp_path / "config.json").write_text("{}")
    done = _cli("--engine-url", "http://127.0.0.1:9", "--model", "m", "--model-dir", str(tmp_path), "--out",
                str(tmp_path / "run"))
    assert done.returncode == 2 and "no engine answers at http://127.0.0.1:9" in done.stderr
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
    engine = EngineServer().start()
    try:
        done = _cli("--engine-url", engine.url, "--model", "nope", "--model-dir", str(tmp_path))
        assert done.returncode == 2 and "does not serve 'nope'" in done.stderr
    finally:
        engine.stop()
    assert all(len(line) < 300 for line in done.stderr.splitlines())


def test_the_loop_samples_the_policy_the_trainer_reproduces() -> None:
    """Every narrowing knob and penalty pinned neutral: nothing is left to an engine default nobody recorded."""
    assert {**FULL_VOCABULARY, "temperature": 1.0} == TRAINING_POLICY
    record = {"metadata": {"provenance": {"sampling_effective": {**FULL_VOCABULARY, "temperature": 1.0},
                                          "sampling_unknown": [], "logprobs_mode": "raw_logprobs"}}}
    assert RecordedSampling.of(record).problems() == []
    with pytest.raises(ValueError, match="temperature > 0"):
        TrainLoop(_settings(temperature=0.0))
    with pytest.raises(ValueError, match="max_group 3 is smaller than the group"):
        TrainLoop(_settings(group=4, max_group=3))


def test_a_temperature_the_engines_logprobs_do_not_follow_is_refused_before_any_rollout(make_stack, tmp_path) -> None:
    """The recorder's health says the engine's logprobs mode (its engine watch measures it): raw logprobs at
    T != 1 are refused before a rollout starts; processed ones, or T = 1, go on; an unknown mode is said."""
    stack = make_stack()
    info = stack.recorder.ctx.engine_info  # what the recorder's engine watch reports under health's "engine"

    def loop(temperature: float, said: list[str]) -> TrainLoop:
        made = TrainLoop(LoopSettings(engine_url=stack.engine.url, recorder_url=stack.recorder.url,
                                      admin_token=stack.admin_token, model="m", model_dir=tmp_path, workdir=tmp_path,
                                      temperature=temperature), progress=said.append)
        said.remove(f"note: {LOCAL_SANDBOX_LIMITS}")  # said once as the loop is made (its own test below)
        return made

    info["logprobs_mode"] = "raw_logprobs"
    said: list[str] = []
    hot = loop(0.7, said)
    with pytest.raises(UnreproducibleSampling, match="temperature 0.7 on an engine whose logprobs are raw"):
        next(hot.iterations(2))
    assert stack.admin.sessions() == [] and said == []  # nothing started
    hot.close()
    loop(1.0, said).refuse_unreproducible_policy()  # raw logprobs are the policy's at T = 1
    info["logprobs_mode"] = "processed_logprobs"
    loop(0.7, said).refuse_unreproducible_policy()
    assert said == []
    info.pop("logprobs_mode")
    loop(0.7, said).refuse_unreproducible_policy()
    assert len(said) == 1 and "not reported" in said[0] and "checked before the step" in said[0]
    with pytest.raises(ValueError, match="at least 1"):
        next(loop(1.0, said).iterations(0))


def test_the_step0_check_scores_each_record_at_its_temperature() -> None:
    """A record sampled at T = 0.5 with processed logprobs checks at ratio 1 with the divisor applied; the same
    logprobs labelled raw are scored by a plain log-softmax and do not."""
    import torch
    import transformers

    from openenv_harness.trainer.train_loop import _check

    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    model = transformers.Qwen2ForCausalLM(config).eval()
    prompt, completion = [3, 9, 11, 2], [40, 41, 13, 17]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1].float()
    hot = torch.log_softmax(logits / 0.5, dim=-1).gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()

    def record(mode: str) -> dict:
        return {"prompt_token_ids": prompt, "completion_token_ids": completion, "per_token_logps": hot,
                "metadata": {"call_kind": "agent", "status": "ok", "node_id": "s/0", "provenance": {
                    "sampling_effective": {**FULL_VOCABULARY, "temperature": 0.5}, "sampling_unknown": [],
                    "logprobs_mode": mode}}}

    assert _check(model, [[record("processed_logprobs")]]).delta_max < 1e-4
    assert _check(model, [[record("raw_logprobs")]]).delta_max > 0.05


def test_a_group_whose_records_the_trainer_cannot_reproduce_stops_the_loop_before_the_step() -> None:
    """The group's rows are built with their records' sampling: raw logprobs at T = 0.7 stop the loop with the
    records' reason; processed ones give rows scored at T = 0.7."""
    from openenv_harness.assembly.trace import HarnessTrace, Segment, TraceMetadata

    def entries(mode: str) -> list[dict]:
        return [{"metadata": {"node_id": "s/0", "call_kind": "agent", "status": "ok", "provenance": {
            "sampling_effective": {**FULL_VOCABULARY, "temperature": 0.7}, "sampling_unknown": [],
            "logprobs_mode": mode}}}]

    row = HarnessTrace(prompt_ids=[1, 2], response_ids=[3, 4], loss_mask=[1, 1], response_logprobs=[-0.5, -0.25],
                       metadata=TraceMetadata(session_id="s", chain_id=0, sample_index=0, strategy="split",
                                              node_ids=["s/0"], segments=[Segment(node_id="s/0", offset=0, length=2,
                                                                                  trainable_tokens=2)]))
    loop = TrainLoop(_settings(temperature=0.7))
    try:
        loop._traces["s"] = [row]
        summary = RolloutSummary("s", 0, [0], 0.0, 0.3, 1, 2, 1, 2, True)
        with pytest.raises(UnreproducibleSampling, match="s/0: the engine's logprobs are raw .* temperature 0.7"):
            loop._samples([(summary, entries("raw_logprobs"))], [1.0])
        samples = loop._samples([(summary, entries("processed_logprobs"))], [1.0])
        assert [(s.temperature_divisor, s.advantage, s.session_id) for s in samples] == [(0.7, 1.0, "s")]
    finally:
        loop.close()


def test_a_step_not_taken_is_not_asked_to_make_the_old_weights_stale() -> None:
    """Every advantage 0: the optimizer did not step, so the old weights are the new ones; the stale
    check cannot tell them apart, and that is not a problem. A step taken is held to it."""
    report = _report(0.009, 0.009)
    assert any("stale weights" in p for p in report.problems())
    report.step.stepped = False
    assert report.problems() == []


def test_a_run_on_the_local_sandbox_says_once_what_it_does_not_isolate() -> None:
    """The local sandbox runs the policy's commands as the user: a training loop on it says so at its
    start, once; on a container sandbox it does not, and a sandbox that cannot run is refused up front."""
    said: list[str] = []
    TrainLoop(_settings(), progress=said.append)
    assert [m for m in said if "local sandbox" in m] == [f"note: {LOCAL_SANDBOX_LIMITS}"]
    assert "--sandbox docker" in LOCAL_SANDBOX_LIMITS and "as you" in LOCAL_SANDBOX_LIMITS
    said.clear()
    loop = TrainLoop(_settings(sandbox="docker"), progress=said.append)
    assert not [m for m in said if "local sandbox" in m] and loop.sandbox_factory is not None
    with pytest.raises(SandboxError, match="unknown sandbox 'jail'"):
        TrainLoop(_settings(sandbox="jail"))
    with pytest.raises(SandboxError, match="not present"):
        TrainLoop(_settings(sandbox="docker", image="openenv-harness/no-such-image:0"))
