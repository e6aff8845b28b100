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

from collections.abc import Iterator
from pathlib import Path

import pytest

from capture_proxy import CaptureProxy
from incremental_checks import assert_one_exact_chain, run_incremental_pi
from real_stack import RealStack
from openenv_harness.engine import VLLMServer
from openenv_harness.recorder.prompt_modes.id_sampling import COMPLETIONS, GENERATE

pytestmark = [pytest.mark.real_engine, pytest.mark.cli, pytest.mark.compat, pytest.mark.slow]


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
        _, agent, trace = run_incremental_pi(stack)
    finally:
        stack.close()
    # the recorder probed generate, was refused by the hop (vLLM never saw it), and chose completions
    probes = no_generate.exchanges_on(GENERATE)
    assert probes and {e.status for e in probes} == {404}
    assert all(r["metadata"]["prompt_mode"]["sampled_via"] == COMPLETIONS for r in agent[1:])
    # one exact chain, as with the generate route
    assert_one_exact_chain(agent, trace, "real-id-prompts")
    # what is recorded is what vLLM's /v1/completions replies carried, id for id and logprob for logprob
    sampled = no_generate.exchanges_on(COMPLETIONS)
    assert [e.status for e in sampled] == [200] * (len(agent) - 1)
    for call, exchange in zip(agent[1:], sampled):
        asked, choice = exchange.request_json(), exchange.reply_json()["choices"][0]
        assert asked["prompt"] == call["prompt_token_ids"] == choice["prompt_token_ids"]
        assert choice["token_ids"] == call["completion_token_ids"]
        assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
        assert choice["logprobs"]["token_logprobs"] == call["per_token_logps"]
