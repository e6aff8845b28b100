"""The RL loop closed on the real stack: real Pi rollouts through the recorder (incremental mode) on
the real vLLM, one GRPO step in transformers on the recorded ids and logprobs, the new weights loaded
into the running vLLM through the recorder's fence, and the next rollouts at the new policy version
-- the smallest loop that proves each point (one tiny update).

The engine is the tier's shared vLLM: its base weights are loaded back afterwards, and the test
checks they are (the engine's own weight checksums), so the tests after it see the model they expect.
"""

from __future__ import annotations

import json
import re
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


@pytest.fixture(scope="module")
def loop_run(vllm: VLLMServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("train-loop")
    stack = RealStack(work / "records.db", vllm.url)
    base = _checksums(vllm.url)
    _hits_of_cached_prompt(vllm.url)  # the prompt's blocks are cached before the sync ...
    settings = LoopSettings(engine_url=vllm.url, recorder_url=stack.recorder.url, admin_token=ADMIN, model=MODEL,
                            model_dir=Path(vllm.settings.model_dir), workdir=work, group=2, next_rollouts=1,
                            max_tokens=96)
    loop = TrainLoop(settings, progress=print)
    stack.admin.set_policy_version(3)  # a trainer resumed from a checkpoint: the loop goes on from there
    try:
        report = loop.run()
        hits_after_sync = _hits_of_cached_prompt(vllm.url)  # ... and not reused by the new weights
        trained = _checksums(vllm.url)
        loop.restore(report)
        sampling = [r["metadata"]["provenance"]["sampling_effective"]
                    for rollout in [*report.before, *report.after] for r in stack.admin.records(rollout.session_id)]
        yield {"report": report, "base": base, "trained": trained, "restored": _checksums(vllm.url),
               "hits_after_sync": hits_after_sync, "sampling": sampling}
    finally:
        DiskWeightSync(stack.admin, vllm.url).reload(vllm.settings.model_dir)  # the base weights, whatever happened
        loop.close()
        stack.close()


def test_one_iteration_closes_the_loop(loop_run: dict[str, Any], record_property) -> None:
    report: LoopReport = loop_run["report"]
    record_property("train_loop", json.dumps({"phases": report.phases, "sync": report.sync.phases,
                                              "before": report.check_before.__dict__,
                                              "after": report.check_after.__dict__,
                                              "stale": report.check_stale.__dict__}))
    print("train loop:", json.dumps(report.as_dict(), default=str)[:4000])
    # 1. a group at version 3, each rollout one exact row that TRL's own reconciler rebuilds identically
    assert all(r.policy_versions == [3] and r.rows == 1 for r in report.before), report.before
    assert all(r.trl_agrees is True for r in [*report.before, *report.after])
    assert all(r.trainable_tokens == r.sampled_tokens > 0 for r in report.before)  # unconstrained: every id trains
    # sampled from the whole distribution the trainer scores, not the model's truncated defaults
    assert loop_run["sampling"] and all(
        (e["top_p"], e["top_k"], e["min_p"], e["repetition_penalty"]) == (1.0, -1, 0.0, 1.0) for e in loop_run["sampling"])
    # 2. the update: the trainer's logprobs of the rows before the step are the engine's (ratio ~1), the
    # advantages rank the group, and the step trained every sampled id
    assert report.step.trainable_tokens == sum(r.trainable_tokens for r in report.before if r.reward is not None)
    # the step starts from the sampling weights: a token is clipped only where fp32 and the engine's bf16
    # disagree past the clip range on a low-probability sample (seen once, 1 token, under a CPU hog)
    assert any(report.step.advantages) and report.step.clipped_tokens <= max(1, report.step.trainable_tokens // 50)
    assert 0.7 < report.step.ratio_min <= report.step.ratio_max < 1.4
    # 3. the sync, through the fence: one version up, the engine's weights changed
    assert (report.sync.version_before, report.sync.version_after) == (3, 4)
    assert report.sync.engine_weight_version == "4"
    base, trained = loop_run["base"], loop_run["trained"]
    changed = sorted(k for k in base if trained.get(k) != base[k])
    # only what the step trained (the last 2 decoder layers, the final norm) and nothing else
    assert changed and all(re.search(r"model\.(layers\.(22|23)\.|norm\.weight$)", k) for k in changed), changed
    # 4. the next rollouts carry version 4; the new weights score them at the floor, the stale ones do not
    assert all(r.policy_versions == [4] for r in report.after)
    assert report.at_floor, (report.check_before, report.check_after)
    assert report.stale_detected, (report.check_after, report.check_stale)
    assert report.problems() == []


def test_the_sync_drops_the_prefix_cache_the_old_weights_computed(loop_run: dict[str, Any]) -> None:
    """A prompt cached before the sync is computed again after it (its KV blocks were the old weights')."""
    assert loop_run["hits_after_sync"] == 0


def test_the_engines_base_weights_are_back(loop_run: dict[str, Any]) -> None:
    report: LoopReport = loop_run["report"]
    assert report.restored is not None and report.restored.version_after == 5
    assert loop_run["restored"] == loop_run["base"]
