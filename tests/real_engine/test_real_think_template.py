"""Incremental mode on the real vLLM serving a reasoning template of today's families (TRL's Qwen3.5
think template, ``--chat-template``), with the real Pi.

The template opens a think block in the generation prompt (``<think>\\n``); under the real Qwen
tokenizer a rendered turn merges that newline with the next, so the template is exact in incremental
mode only -- which the certificate must say. The model samples what it samples; what holds for any
sample: every agent call after the first continues its chain from exactly the previous prompt and
sampled ids, or falls back with a named reason (a cut at ``max_tokens`` cannot be continued); every
continued call is exact; and the records say where vLLM's own full render differs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from real_stack import MODEL, RealStack
from openenv_harness.cli.stack import REAL_ENGINE_SAMPLING
from openenv_harness.engine import VLLMServer
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.rollout.report import run_rollout

pytestmark = [pytest.mark.real_engine, pytest.mark.cli, pytest.mark.slow]

#: fallbacks that are facts about the sample, not uncertainty about the template
SAMPLE_FALLBACKS = {"turn_not_ended"}


def test_an_incremental_rollout_on_a_think_template_continues_its_chain(think_vllm: VLLMServer,
                                                                       tmp_path: Path) -> None:
    stack = RealStack(tmp_path / "records.db", think_vllm.url)
    try:
        cert = stack.admin.health()["engine"]["template_certification"]
        factory = HarnessSessionFactory(harness="pi", recorder_url=stack.recorder.url, admin_token=stack.admin_token,
                                        model=MODEL, tasks={"fix-add": BUILTIN_TASKS["fix-add"]},
                                        budgets={"max_agent_calls": 3, "max_wall_clock_s": 400},
                                        sampling=dict(REAL_ENGINE_SAMPLING), prompt_mode="incremental",
                                        require_exact_template=True)
        report, session = run_rollout(factory, "fix-add", timeout_s=450)
        assert session is not None, report.error
        records = stack.admin.records(session.session_id)
        session.close()
    finally:
        stack.close()
    assert cert["exact_in"] == ["incremental"], cert
    assert cert["properties"]["turn_start"] is False and cert["properties"]["junction"] is True
    agent = [r for r in records if r["metadata"]["call_kind"] == "agent"]
    assert len(agent) >= 2, [r["metadata"]["status"] for r in records]
    modes = [r["metadata"]["prompt_mode"] for r in agent]
    assert modes[0]["reason"] == "chain_start"
    continued = 0
    for prev, call, mode in zip(agent, agent[1:], modes[1:]):
        if not mode["continued"]:
            assert mode["reason"] in SAMPLE_FALLBACKS, mode
            assert prev["metadata"]["finish_reason"] == "length"  # the sample itself was cut
            continue
        continued += 1
        chain = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert call["prompt_token_ids"][:len(chain)] == chain  # continued from exactly what was sampled
        assert call["metadata"]["fidelity"]["class"] == "exact"
        assert "identical" in mode["full_render_diff"]  # the contrast with vLLM's own full render is recorded
    assert continued >= 1 or all(r["metadata"]["finish_reason"] == "length" for r in agent[:-1])
