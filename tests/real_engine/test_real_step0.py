"""The step-0 proof on the real model: transformers' logprobs of the recorded ids equal vLLM's.

The same Qwen2.5-Coder-0.5B-Instruct the real vLLM serves is loaded by transformers on the CPU and
scores every sampled token of the records in one teacher-forced pass per sample. With the policy
unchanged every importance ratio must be 1 up to numerical noise -- and the noise floor is measured
here, not assumed: the same tokens scored by transformers in bf16 (vLLM's dtype) and in fp32, on the
short free session. The agent rollouts (prompts of thousands of ids) are scored in the dtype
``trace verify`` picks for this CPU (``scoring_dtype("auto")``: fp32 where bf16 matmuls are emulated,
a hundred times slower), against the engine's bf16 logprobs: within the same floor.
The contrast: the message-level path (re-render the messages with the chat template, tokenize,
score the assistant spans) on the same rollout, whose ratios are not 1.

Unconstrained calls are the proof; calls under ``tool_choice: "required"`` carry post-mask
logprobs and are reported apart (``logprobs_are_policy: false``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from real_stack import ADMIN, MODEL, RealStack
from openenv_harness.engine import VLLMServer
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.rollout.report import run_rollout
from openenv_harness.trainer.verify import contrast_rerender, load_model, score_tokens, verify_records

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


@pytest.fixture(scope="module")
def hf(vllm: VLLMServer) -> tuple[Any, Any]:
    """The trainer's model in the dtype ``trace verify`` scores in on this CPU."""
    return load_model(str(vllm.settings.model_dir), dtype="auto")


def _in_dtype(model: Any, dtype: str, records: list[dict[str, Any]]) -> list[list[float]]:
    """The records' sampled tokens scored with ``model`` cast to ``dtype`` (cast back after)."""
    before = next(model.parameters()).dtype
    getattr(model, "float" if dtype == "float32" else "bfloat16")()
    try:
        return [score_tokens(model, r["prompt_token_ids"], r["completion_token_ids"]) for r in records]
    finally:
        model.to(before)  # lossless both ways for weights loaded in bf16


@pytest.fixture(scope="module")
def noise_floor(free_session, hf) -> float:
    """The largest |bf16 - fp32| logprob over the free session's sampled tokens (short prompts: bf16
    scoring is affordable even where it is emulated)."""
    model, _ = hf
    records = free_session["records"]
    bf16, fp32 = _in_dtype(model, "bfloat16", records), _in_dtype(model, "float32", records)
    return max(abs(a - b) for x, y in zip(bf16, fp32) for a, b in zip(x, y))


@pytest.fixture(scope="module")
def free_session(vllm: VLLMServer, tmp_path_factory) -> dict[str, Any]:
    """Two unconstrained agent calls of one conversation (the model answers in text), sampled at
    the model's own temperature: the records a trainer would score."""
    store = tmp_path_factory.mktemp("step0") / "records.db"
    stack = RealStack(store, vllm.url)
    try:
        sid, secret = stack.session(sampling={"seed": 7})
        messages = [{"role": "system", "content": "You are a coding agent."},
                    {"role": "user", "content": "Write a Python function that adds two numbers."}]
        first = stack.chat(sid, secret, {"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 48})
        assert first.status_code == 200, first.text
        messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "Now add a docstring."}]
        second = stack.chat(sid, secret, {"model": MODEL, "messages": messages, "tools": TOOLS, "max_tokens": 48})
        assert second.status_code == 200, second.text
        return {"records": stack.admin.records(sid), "store": store, "session_id": sid}
    finally:
        stack.close()


FREE_SAMPLING = {"temperature": 0, "seed": 0, "max_tokens": 48}  # no tool_choice pin: the policy's own logprobs


@pytest.fixture(scope="module")
def free_rollouts(vllm: VLLMServer, tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    """A real Pi and a real OpenCode rollout on the real vLLM with nothing constraining the decoding: this
    0.5B model then answers the task in text (a JSON code block, no tool call), so each rollout is one
    agent call -- unconstrained, its logprobs the policy's. Short (48 tokens) to keep the tier quick."""
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


@pytest.mark.parametrize("harness", ["pi", "opencode"])
def test_the_proof_on_real_agent_rollouts(harness: str, free_rollouts, hf, noise_floor: float,
                                          record_property) -> None:
    """Every sampled token of a real, unconstrained Pi / OpenCode rollout, as recorded, scored by the
    trainer's model: the ratios sit at the noise floor (bf16 against fp32, measured on the free session)."""
    model, tokenizer = hf
    records = [r for r in free_rollouts[harness] if r["metadata"]["status"] == "ok"]
    assert records and all(r["metadata"]["logprobs_are_policy"] is True for r in records)
    assert all(r["metadata"]["provenance"]["decoding_constraint"] in (None, {}) for r in records)
    report = verify_records(records, model, tokenizer)
    assert not any(c.constrained for c in report.calls)
    assert report.policy.tokens == sum(len(r["completion_token_ids"]) for r in records) > 0
    floor = noise_floor
    record_property("step0_" + harness, json.dumps({"policy": report.policy.__dict__, "bf16_vs_fp32_floor": floor,
                                                    "scored_in": report.dtype}))
    print(f"step-0 proof on a real {harness} rollout:", json.dumps(report.policy.__dict__), "floor:", floor)
    # every token within the floor's reach, and on average below the floor itself (a few dozen tokens make
    # the share within 1 +- 0.05 a coarse figure here: it is reported, not asserted)
    assert report.policy.delta_max <= max(0.25, 3 * floor), report.policy
    assert report.policy.delta_mean <= floor and abs(report.policy.kl) < 0.02, (report.policy, floor)


def test_the_trainers_logprobs_of_the_recorded_ids_match_the_engines(free_session, hf, noise_floor: float,
                                                                     record_property) -> None:
    model, tokenizer = hf
    records = free_session["records"]
    # scored in bf16, vLLM's dtype (short prompts: affordable even where bf16 is emulated); the weights
    # are bf16 values (the model folder is bf16), so the casts there and back are lossless
    before = next(model.parameters()).dtype
    model.bfloat16()
    try:
        report = verify_records(records, model, tokenizer)
    finally:
        model.to(before)
    assert [c.constrained for c in report.calls] == [False, False]
    floor = noise_floor  # the same tokens scored by transformers in bf16 and in fp32
    record_property("step0", json.dumps({"policy": report.policy.__dict__, "bf16_vs_fp32_floor": floor}))
    print("step-0 proof:", json.dumps(report.policy.__dict__), "bf16/fp32 floor:", floor)
    assert report.policy.tokens == sum(len(r["completion_token_ids"]) for r in records)
    # at the numerical noise floor: bf16 kernels of two engines differ by about what bf16 and fp32 do
    assert report.policy.delta_max <= max(0.25, 3 * floor), report.policy
    # the share within 1 +- 0.05 over ~100 tokens moves a percent a token (94.8 % and 100 % seen on two CPUs'
    # bf16 kernels): reported, not asserted; the bound on every token above and the KL are the proof
    assert abs(report.policy.kl) < 0.02 and report.policy.delta_mean <= floor, (report.policy, floor)


def test_rerendering_the_messages_is_not_what_was_sampled(rollouts, hf, record_property) -> None:
    """On a real Pi rollout (tool calls under the grammar): the message-level path re-renders the
    tool-call tag as the special id, so the spans it scores are not the sampled tokens."""
    model, tokenizer = hf
    records = rollouts["pi"]["records"]
    ours = verify_records(records, model, tokenizer)
    contrast = contrast_rerender(records, model, tokenizer)
    record_property("contrast", json.dumps({"ours_constrained": ours.constrained.__dict__,
                                            "rerender": contrast.total.__dict__}))
    print("records (constrained, reported apart):", json.dumps(ours.constrained.__dict__))
    print("re-render path:", json.dumps(contrast.as_dict()))
    assert all(c.constrained for c in ours.calls) and ours.policy.tokens == 0
    assert contrast.turns and all(t.misaligned > 0 for t in contrast.turns)
    assert any(t.rerendered_tokens != t.sampled_tokens for t in contrast.turns)


def test_trace_verify_prints_the_table_and_stores_it_for_the_viewer(free_session, vllm: VLLMServer) -> None:
    from openenv_harness.viewer.verifications import load_verification

    done = subprocess.run([sys.executable, "-m", "openenv_harness.cli", "trace", "verify", free_session["session_id"],
                           "--store", str(free_session["store"]), "--model", str(vllm.settings.model_dir)],
                          capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "step-0 verification" in done.stdout and "policy" in done.stdout
    stored = load_verification(str(free_session["store"]), free_session["session_id"])
    assert sorted(stored) == [r["metadata"]["call_index"] for r in free_session["records"]]
    assert all(not v["constrained"] and v["delta_max"] < 0.5 for v in stored.values())
