"""``trace verify`` and ``trace export`` as a trainer's pipeline runs them: logprobs that are not the
model's fail (exit 1, one line naming the limits broken with the numbers), records whose sampling
cannot be reproduced are refused (exit 1, "cannot verify" with the reason), a proof over no policy
token is no proof (exit 1, "nothing verified"), the summary is machine-readable, an unknown session
is an error and never an empty file, and constrained calls are never exported as trainable (a session of
nothing else exports nothing: an error saying so)."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from array import array
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from openenv_harness.recorder.store import SQLiteStore  # noqa: E402
from openenv_harness.recorder.store.base import PendingRecord  # noqa: E402
from openenv_harness.trainer.limits import DEFAULT_LIMITS  # noqa: E402
from openenv_harness.trainer.sampling import TRAINING_POLICY  # noqa: E402
from openenv_harness.viewer.verifications import verification_path  # noqa: E402

PROMPT, COMPLETION = [5, 9, 11, 2, 40, 41], [13, 17, 19]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "openenv_harness.cli", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, hf_tokenizer) -> Path:
    """A small randomly initialised Qwen2 with the reference tokenizer, saved as a Hugging Face folder."""
    folder = tmp_path_factory.mktemp("policy")
    tokenizer = hf_tokenizer()
    config = transformers.Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=512)
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _own_logprobs(folder: Path) -> list[float]:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        logps = torch.log_softmax(model(input_ids=torch.tensor([PROMPT + COMPLETION])).logits[0].float(), dim=-1)
    return [logps[len(PROMPT) - 1 + i, tok].item() for i, tok in enumerate(COMPLETION)]


def _store(path: Path, logps: list[float], *, constrained: bool, mode: str = "raw_logprobs", **sampling: float) -> str:
    """Two agent calls of session "s" with ``logps`` as their recorded logprobs, sampled under the training
    policy unless ``sampling`` says otherwise."""
    provenance = {"sampling_effective": {**TRAINING_POLICY, **sampling}, "sampling_unknown": [], "logprobs_mode": mode}
    async def write() -> None:
        store = SQLiteStore(path)
        store.open()
        try:
            for index in range(2):
                await store.append(PendingRecord(
                    session_id="s", call_index=index, call_kind="agent", status="ok",
                    request={"model": "m", "messages": [{"role": "user", "content": "q"}]},
                    response={"id": f"c{index}", "choices": [{"index": 0, "finish_reason": "stop",
                                                              "message": {"role": "assistant", "content": "ok"}}]},
                    prompt_ids=array("I", PROMPT), completion_ids=array("I", COMPLETION),
                    logprobs=array("d", logps), completion_tokens=None, trainable=True,
                    metadata={"node_id": f"s/{index}", "call_index": index, "session_id": "s", "status": "ok",
                              "call_kind": "agent", "trainable": True, "finish_reason": "stop",
                              "logprobs_are_policy": not constrained, "provenance": provenance},
                    created_at=1.5))
            await store.caught_up()
        finally:
            store.close()

    asyncio.run(write())
    return str(path)


@pytest.mark.slow  # two CLI runs, each loading and scoring the model (~8.5 s)
def test_an_all_constrained_session_verifies_nothing_and_says_so(tmp_path: Path, model_dir: Path) -> None:
    store = _store(tmp_path / "records.db", _own_logprobs(model_dir), constrained=True)
    done = cli("trace", "verify", "s", "--store", store, "--model", str(model_dir))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "nothing verified" in done.stderr
    assert "6 constrained token(s)" in done.stderr
    as_json = cli("trace", "verify", "s", "--store", store, "--model", str(model_dir), "--json")
    assert as_json.returncode == 1
    summary = json.loads(as_json.stdout)
    assert summary["verified"] is False and summary["policy_tokens"] == 0 and summary["constrained_tokens"] == 6


def test_a_policy_session_verifies_at_ratio_one(tmp_path: Path, model_dir: Path) -> None:
    store = _store(tmp_path / "records.db", _own_logprobs(model_dir), constrained=False)
    # the recorded logprobs are bf16's: scored in bf16 the ratios are 1 (auto may pick float32 on this CPU)
    done = cli("trace", "verify", "s", "--store", store, "--model", str(model_dir), "--json", "--dtype", "bfloat16")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["verified"] is True and summary["policy_tokens"] == 6 and summary["failed_limits"] == []
    assert summary["verdict"]["status"] == "verified" and summary["limits"]["delta_mean"] == DEFAULT_LIMITS.delta_mean
    assert math.isclose(summary["policy"]["ratio_min"], 1.0, abs_tol=1e-3)
    assert math.isclose(summary["policy"]["ratio_max"], 1.0, abs_tol=1e-3)
    assert abs(summary["policy"]["mean_log_ratio"]) < 1e-3 and 0 <= summary["policy"]["kl_k3"] < 1e-5
    assert "kl" not in summary["policy"]


@pytest.mark.slow  # three CLI runs, each loading and scoring the model
def test_logprobs_that_are_not_the_models_fail_with_the_limits_and_the_numbers(tmp_path: Path, model_dir: Path) -> None:
    shifted = [lp - 0.4 for lp in _own_logprobs(model_dir)]
    store = _store(tmp_path / "records.db", shifted, constrained=False)
    args = ("trace", "verify", "s", "--store", store, "--model", str(model_dir), "--dtype", "bfloat16")
    done = cli(*args)
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = [x for x in done.stderr.splitlines() if x.strip()]
    assert line.startswith("step-0 check failed over 6 policy token(s): mean |δ| 0.4")
    assert f"> {DEFAULT_LIMITS.delta_mean:g}" in line and f"share of ratios within 1±ε 0 < {DEFAULT_LIMITS.share_within:g}" in line
    assert "step-0 verification of s" in done.stdout  # the table still shows every call
    stored = json.loads(verification_path(store, "s").read_text())
    assert stored["verified"] is False and stored["verdict"]["status"] == "failed"
    as_json = cli(*args, "--json")
    assert as_json.returncode == 1
    summary = json.loads(as_json.stdout)
    assert summary["verified"] is False
    failed = {f["limit"]: f for f in summary["failed_limits"]}
    assert {"delta_mean", "share_within"} <= set(failed)
    assert math.isclose(failed["delta_mean"]["value"], 0.4, abs_tol=0.01)
    assert failed["delta_mean"]["bound"] == DEFAULT_LIMITS.delta_mean
    assert math.isclose(summary["policy"]["mean_log_ratio"], 0.4, abs_tol=0.01)  # signed: the trainer's is higher
    # the limits can be overridden (the defaults are the documented ones): loose enough, the same records pass
    loose = cli(*args, "--max-mean-delta", "1", "--max-p99-delta", "1", "--max-delta", "1", "--min-share-within", "0",
                "--max-kl", "1")
    assert loose.returncode == 0, loose.stderr
    assert "verified: 6 policy token(s) within the limits (mean |δ| ≤ 1," in loose.stdout


def test_records_whose_sampling_cannot_be_reproduced_are_refused_by_name(tmp_path: Path, model_dir: Path) -> None:
    store = _store(tmp_path / "records.db", _own_logprobs(model_dir), constrained=False, temperature=0.7)
    done = cli("trace", "verify", "s", "--store", store, "--model", str(model_dir), "--dtype", "bfloat16", "--json")
    assert done.returncode == 1, done.stderr
    summary = json.loads(done.stdout)
    assert summary["verified"] is False and summary["verdict"]["status"] == "cannot verify"
    assert summary["policy_tokens"] == 0 and [c["node_id"] for c in summary["refused"]] == ["s/0", "s/1"]
    assert summary["verdict"]["line"].startswith("cannot verify: 2 record(s) cannot be scored as they were sampled")
    assert "raw (before temperature): at temperature 0.7" in summary["verdict"]["line"]


def test_nonsensical_limits_are_refused_before_anything_loads(tmp_path: Path, model_dir: Path) -> None:
    store = _store(tmp_path / "records.db", [-0.5] * 3, constrained=False)
    done = cli("trace", "verify", "s", "--store", store, "--model", str(model_dir), "--min-share-within", "2")
    assert done.returncode == 2 and "share_within is a share" in done.stderr and "Traceback" not in done.stderr


def test_a_missing_model_folder_is_named_as_one(tmp_path: Path) -> None:
    store = _store(tmp_path / "records.db", [-0.5] * 3, constrained=False)
    done = cli("trace", "verify", "s", "--store", store, "--model", str(tmp_path / "no-such-model"))
    assert done.returncode == 2
    assert "no-such-model does not exist" in done.stderr and "Traceback" not in done.stderr


def test_export_masks_constrained_calls_and_refuses_an_unknown_session(tmp_path: Path) -> None:
    store = _store(tmp_path / "records.db", [-1e-9, -14.0, -0.1], constrained=True)
    # post-mask logprobs are never trainable: with every call constrained there is nothing to train
    masked = cli("trace", "export", "s", "--store", store, "--format", "harness")
    assert masked.returncode == 2 and not masked.stdout
    assert "nothing trainable in format harness: 2 records: 2 calls under a decoding constraint" in masked.stderr
    assert "--non-policy keep" in masked.stderr
    kept = json.loads(cli("trace", "export", "s", "--store", store, "--format", "harness",
                          "--non-policy", "keep").stdout)
    assert sum(sum(row["loss_mask"]) for row in kept) == 6
    assert all(not seg["logprobs_are_policy"] for row in kept for seg in row["metadata"]["segments"])
    out = tmp_path / "out.jsonl"
    unknown = cli("trace", "export", "nobody", "--store", store, "--out", str(out))
    assert unknown.returncode == 2 and "no records for session nobody" in unknown.stderr
    assert not out.exists(), "no empty file left behind for a pipeline to read"


def test_auto_scores_in_the_dtype_the_engine_computes_in_here(monkeypatch: pytest.MonkeyPatch) -> None:
    from openenv_harness.engine import setup
    from openenv_harness.trainer.verify import scoring_dtype

    monkeypatch.setattr(setup, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    assert scoring_dtype("auto") == "bfloat16"
    monkeypatch.setattr(setup, "cpu_flags", lambda: {"avx2", "avx512f"})  # AVX-512 emulates bf16 without BF16
    assert scoring_dtype("auto") == "float32"
    assert scoring_dtype("bfloat16") == "bfloat16" and scoring_dtype("float32") == "float32"
