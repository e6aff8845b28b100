"""Unmodified Pi acting on the real vLLM with no decoding constraint: every call under the training
sampling policy (temperature 1, the whole vocabulary), ``tool_choice`` left to the agent (auto), the
model's tool-call hint appended through Pi's own ``--append-system-prompt``, and the engine's
``openenv_json`` tool parser reading the calls the model writes. The agent's tools run, the rollouts
take several calls, and every sampled id is trainable with its recorded logprob: the run's own
summary line says so, and the records show why (no constraint, the policy's logprobs, incremental
chains). Also: the parser plugin, loaded by vLLM itself from this repository, turns the model's own
untagged JSON into tool calls while plain answers stay text.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from openenv_harness.engine import VLLMServer
from openenv_harness.engine.model import QWEN_TOOL_CALL_HINT
from real_stack import MODEL

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

ROLLOUTS = 3


def test_the_engine_reads_untagged_json_calls_and_leaves_prose_as_text(vllm: VLLMServer) -> None:
    tools = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                               "parameters": {"type": "object", "required": ["command"],
                                                              "properties": {"command": {"type": "string"}}}}}]
    body = {"model": MODEL, "tools": tools, "temperature": 0, "max_tokens": 60, "logprobs": True,
            "messages": [{"role": "user", "content": "List the files in the current directory."}]}
    choice = httpx.post(vllm.url + "/v1/chat/completions", json=body, timeout=300).json()["choices"][0]
    sampled = "".join(t["token"] for t in choice["logprobs"]["content"])
    # greedy, the model writes the call as a fenced JSON block, not in its template's <tool_call> tags ...
    assert sampled.startswith("```json") and "<tool_call>" not in sampled, sampled
    # ... and the engine's parser reads it: the agent gets a tool call it can run
    calls = choice["message"].get("tool_calls") or []
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("bash", {"command": "ls"})], choice
    assert choice["finish_reason"] == "tool_calls" and not choice["message"].get("content")
    # an answer in prose, and a JSON block that is not a call to a declared tool, stay text
    for question, expected in (("What is the capital of France? Answer in one sentence.", "Paris"),
                               ("Write a JSON object with keys a and b set to 1 and 2, in a json code block.",
                                '"a": 1')):
        prose = {"model": MODEL, "tools": tools, "temperature": 0, "max_tokens": 40,
                 "messages": [{"role": "user", "content": question}]}
        answer = httpx.post(vllm.url + "/v1/chat/completions", json=prose, timeout=300).json()["choices"][0]
        assert not answer["message"].get("tool_calls") and expected in answer["message"]["content"], answer


def test_pi_acts_unconstrained_and_every_sampled_id_is_trainable(vllm: VLLMServer, tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "openenv_harness.cli", "run", "--engine-url", vllm.url, "--model", MODEL,
         "--harness", "pi", "--task", "write-greeting", "--prompt-mode", "incremental", "--training-sampling", "1",
         "--system-prompt-suffix", QWEN_TOOL_CALL_HINT, "--rollouts", str(ROLLOUTS), "--concurrency", "1",
         "--max-agent-calls", "4", "--out", str(out)],
        capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = re.search(r"incremental: (\d+) rollout\(s\) -> \d+ row\(s\), (\d+)% of (\d+) sampled ids trainable", done.stdout)
    assert line is not None, done.stdout[-3000:]
    assert (int(line.group(1)), int(line.group(2))) == (ROLLOUTS, 100) and int(line.group(3)) > 0
    assert "decoding constraint" not in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary) == ROLLOUTS
    # the records: the agent's own tool calls ran (a tool result comes back), with no constraint anywhere
    multi_call = 0
    for rollout in summary:
        exported = subprocess.run([sys.executable, "-m", "openenv_harness.cli", "trace", "export",
                                   rollout["session_id"], "--store", str(out / "records.db"), "--format", "entries"],
                                  capture_output=True, text=True, timeout=120)
        assert exported.returncode == 0, exported.stderr
        agent = [r for r in map(json.loads, exported.stdout.splitlines()) if r["metadata"]["call_kind"] == "agent"]
        assert agent
        for record in agent:
            assert record["metadata"]["provenance"]["decoding_constraint"] is None
            assert record["metadata"]["logprobs_are_policy"] is True
            assert record["request"].get("tool_choice") in (None, "auto")
            assert len(record["per_token_logps"]) == len(record["completion_token_ids"]) > 0
            # the hint is what Pi itself sent, in its own system prompt (Pi adds the date and directory after it)
            assert QWEN_TOOL_CALL_HINT in record["request"]["messages"][0]["content"]
        if len(agent) >= 2 and any(m.get("role") == "tool" for m in agent[-1]["request"]["messages"]):
            multi_call += 1
    assert multi_call >= 1, "no rollout ran one of the agent's tool calls and called the model again"
