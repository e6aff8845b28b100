"""Unmodified Pi in a container sandbox on the real vLLM: the agent's only way out of its container is
the relay on the container's loopback, and what the recorder stores is what vLLM sampled, as the
capture proxy between the recorder and vLLM saw it -- the same recorder path as the local sandbox.
Sampling is the training policy's (temperature 1, no decoding constraint), as in
``test_real_unconstrained``, so every sampled id is trainable with its recorded logprob."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from capture_proxy import CaptureProxy
from openenv_harness.engine import VLLMServer
from openenv_harness.engine.model import QWEN_TOOL_CALL_HINT
from openenv_harness.recorder.prompt_modes.id_sampling import COMPLETIONS, GENERATE, as_generate_response
from openenv_harness.testing.containers import require_default_image
from real_stack import MODEL

pytestmark = [pytest.mark.real_engine, pytest.mark.cli, pytest.mark.slow]


def test_pi_in_a_container_records_what_vllm_sampled(vllm: VLLMServer, tmp_path: Path) -> None:
    image = require_default_image()
    capture = CaptureProxy(vllm.url).start()
    out = tmp_path / "run"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "openenv_harness.cli", "run", "--engine-url", capture.url, "--model", MODEL,
             "--harness", "pi", "--task", "write-greeting", "--sandbox", "docker", "--image", image,
             "--prompt-mode", "incremental", "--training-sampling", "1", "--system-prompt-suffix", QWEN_TOOL_CALL_HINT,
             "--max-agent-calls", "3", "--out", str(out)],
            capture_output=True, text=True, timeout=1200)
        exchanges = capture.exchanges_on(GENERATE) + capture.exchanges_on(COMPLETIONS) + capture.chat_exchanges()
    finally:
        capture.stop()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = re.search(r"incremental: 1 rollout\(s\) -> \d+ row\(s\), (\d+)% of (\d+) sampled ids trainable", done.stdout)
    assert line is not None and line.group(1) == "100" and int(line.group(2)) > 0, done.stdout[-3000:]
    [row] = json.loads((out / "summary.json").read_text())
    assert row["agent_calls"] >= 1 and row.get("unscored_reason") is None, row
    exported = subprocess.run([sys.executable, "-m", "openenv_harness.cli", "trace", "export", row["session_id"],
                               "--store", str(out / "records.db"), "--format", "entries"],
                              capture_output=True, text=True, timeout=120)
    assert exported.returncode == 0, exported.stderr
    agent = [r for r in map(json.loads, exported.stdout.splitlines()) if r["metadata"]["call_kind"] == "agent"]
    assert len(agent) == row["agent_calls"]
    # every sampled id and logprob the recorder stored is in one of vLLM's own replies, as the proxy saw them
    replies = [e.reply_json() for e in exchanges if e.status == 200]
    for record in agent:
        assert record["metadata"]["status"] == "ok" and record["metadata"]["logprobs_are_policy"] is True
        ids, logps = record["completion_token_ids"], record["per_token_logps"]
        assert any(_sampled(reply) == (ids, logps) for reply in replies), "a record no vLLM reply carries"


def _sampled(reply: dict) -> tuple[list[int], list[float]]:
    """The ids and logprobs a vLLM reply carries, from either route the recorder uses."""
    reply = as_generate_response(reply) or reply if reply.get("object") == "text_completion" else reply
    choice = (reply.get("choices") or [{}])[0]
    return choice.get("token_ids") or [], [e["logprob"] for e in (choice.get("logprobs") or {}).get("content") or []]
