"""Incremental mode on the real vLLM seen without ``/inference/v1/generate``: ids sampled on ``/v1/completions``.

A router in front of vLLM (or a build without ``--enable-scale-out``'s generate route) may offer only
``/v1/completions``; that route takes an id prompt on every vLLM. Here the real engine is reached
through the capture hop with ``/inference/v1/generate`` hidden (answered 404 by the hop, never by
vLLM), so the recorder's probe finds no generate route and samples continued calls on
``/v1/completions``, while render and derender are the real engine's own. The incremental Pi rollout
must still be one exact chain (as ``test_real_incremental.py``), and what is recorded must be exactly
what vLLM's completion replies carried: the prompt ids it echoed, the sampled ids and their logprobs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from capture_proxy import CaptureProxy
from real_stack import MODEL, RealStack
from openenv_harness.cli.stack import REAL_ENGINE_SAMPLING
from openenv_harness.engine import VLLMServer
from openenv_harness.recorder.id_sampling import COMPLETIONS, GENERATE
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.rollout.report import run_rollout

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl.experimental.async_grpo.async_rollout_worker import _chain_to_sequences  # noqa: E402
from trl.experimental.async_grpo.openenv_harness import _turns_from_training_trace  # noqa: E402

pytestmark = [pytest.mark.real_engine, pytest.mark.cli, pytest.mark.compat, pytest.mark.slow]

TOOL_CALL_ID = 151657  # <tool_call> in the Qwen2.5 vocabulary


@pytest.fixture
def no_generate(vllm: VLLMServer) -> Iterator[CaptureProxy]:
    proxy = CaptureProxy(vllm.url, hidden=frozenset({GENERATE})).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def test_an_incremental_pi_rollout_samples_on_id_prompt_completions(tmp_path: Path, no_generate: CaptureProxy) -> None:
    stack = RealStack(tmp_path / "records.db", no_generate.url)
    try:
        factory = HarnessSessionFactory(harness="pi", recorder_url=stack.recorder.url, admin_token=stack.admin_token,
                                        model=MODEL, tasks={"fix-add": BUILTIN_TASKS["fix-add"]},
                                        budgets={"max_agent_calls": 3, "max_wall_clock_s": 400},
                                        sampling=dict(REAL_ENGINE_SAMPLING), prompt_mode="incremental",
                                        prompt_mode_strict=True)
        report, session = run_rollout(factory, "fix-add", timeout_s=450)
        assert session is not None, report.error
        trace = session.fetch_training_trace()
        records = stack.admin.records(session.session_id)
        session.close()
    finally:
        stack.close()
    agent = [r for r in records if r["metadata"]["call_kind"] == "agent"]
    assert len(agent) >= 2, [r["metadata"]["status"] for r in records]
    # the recorder probed generate, was refused by the hop (vLLM never saw it), and chose completions
    probes = no_generate.exchanges_on(GENERATE)
    assert probes and {e.status for e in probes} == {404}
    modes = [r["metadata"]["prompt_mode"] for r in agent]
    assert [m["continued"] for m in modes] == [False] + [True] * (len(agent) - 1)
    assert all(m["sampled_via"] == COMPLETIONS for m in modes[1:])
    # one exact chain, as with the generate route
    assert [r["metadata"]["fidelity"]["class"] for r in agent] == ["root"] + ["exact"] * (len(agent) - 1)
    for prev, call in zip(agent, agent[1:]):
        assert TOOL_CALL_ID not in prev["completion_token_ids"]  # the tag was sampled as text ...
        chain = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert call["prompt_token_ids"][:len(chain)] == chain  # ... and the engine continued from exactly that
        diff = call["metadata"]["prompt_mode"]["full_render_diff"]
        assert diff["identical"] is False and diff["position"] < len(chain)
    # what is recorded is what vLLM's /v1/completions replies carried, id for id and logprob for logprob
    sampled = no_generate.exchanges_on(COMPLETIONS)
    assert [e.status for e in sampled] == [200] * (len(agent) - 1)
    for call, exchange in zip(agent[1:], sampled):
        asked, choice = exchange.request_json(), exchange.reply_json()["choices"][0]
        assert asked["prompt"] == call["prompt_token_ids"] == choice["prompt_token_ids"]
        assert choice["token_ids"] == call["completion_token_ids"]
        assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
        assert choice["logprobs"]["token_logprobs"] == call["per_token_logps"]
    turns = _turns_from_training_trace(trace)
    rows, tally = _chain_to_sequences(turns, "real-id-prompts", 0)
    assert tally["clean"] == len(agent) - 1 and tally["fork"] == 0.0 and len(rows) == 1
    assert sum(rows[0].completion_mask) == sum(len(r["completion_token_ids"]) for r in agent)
