"""Real Pi and real OpenCode, multi-turn and tool-using, on the real vLLM; then TRL 1.16's own
reconciler and the project's assembler over what was recorded.

Sampling is pinned (greedy, seeded) and so is ``tool_choice: "required"``: this 0.5B model answers
tool requests with a JSON code block unless constrained. That constraint makes a replay drift at
every tool turn on this stack, and the test asserts it as the fact it is: the grammar makes the
model sample the ``<tool_call>`` tag as plain-text pieces, while the chat template renders the
tool call on replay with the special id 151657. Nothing here asserts the model's words.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest
from openenv.core.harness import TrainingTrace

from real_stack import MODEL
from openenv_harness.assembly import assemble_session

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl.experimental.async_grpo.async_rollout_worker import _chain_to_sequences  # noqa: E402
from trl.experimental.async_grpo.openenv_harness import _turns_from_training_trace  # noqa: E402

pytestmark = [pytest.mark.real_engine, pytest.mark.cli, pytest.mark.compat, pytest.mark.slow]

TOOL_CALL_ID = 151657  # <tool_call> in the Qwen2.5 vocabulary


@pytest.mark.parametrize("harness", ["pi", "opencode"])
def test_records_are_what_vllm_sampled(harness: str, rollouts: dict[str, Any]) -> None:
    run = rollouts[harness]
    report, records = run["report"], run["records"]
    agent = [r for r in records if r["metadata"]["call_kind"] == "agent"]
    assert report.agent_calls == len(agent) >= 2, (report, [r["metadata"]["status"] for r in records])
    assert report.stop_reason == "max_agent_calls"  # the pinned tool choice never lets the model stop
    sampled = {tuple(e.reply_json()["prompt_token_ids"]): e.reply_json() for e in run["exchanges"]}
    for record in agent:
        md = record["metadata"]
        assert md["status"] == "ok" and md["trainable"] is True, md["invalid_reasons"]
        raw = sampled[tuple(record["prompt_token_ids"])]
        assert record["completion_token_ids"] == raw["choices"][0]["token_ids"]
        assert record["per_token_logps"] == [e["logprob"] for e in raw["choices"][0]["logprobs"]["content"]]
        assert md["provenance"]["decoding_constraint"] == {"tool_choice": "required"}
        assert md["logprobs_are_policy"] is False
        assert md["provenance"]["sampling"]["temperature"] == 0


@pytest.mark.parametrize("harness", ["pi", "opencode"])
def test_the_tag_sampled_as_text_drifts_at_every_tool_turn(harness: str, rollouts: dict[str, Any], vllm) -> None:
    agent = [r for r in rollouts[harness]["records"] if r["metadata"]["call_kind"] == "agent"]
    for prev, call in zip(agent, agent[1:]):
        sampled = prev["completion_token_ids"]
        # the tag is text pieces (their split varies: "<","tool","_call" or "<","tool","_","call"),
        # never the special id
        text = httpx.post(vllm.url + "/detokenize", json={"model": MODEL, "tokens": sampled}, timeout=60).json()["prompt"]
        assert text.startswith("<tool_call>") and TOOL_CALL_ID not in sampled
        # the replayed turn is rendered with the special id: the prompt does not extend prompt + sampled
        prefix = prev["prompt_token_ids"] + sampled
        assert call["prompt_token_ids"][:len(prefix)] != prefix
        assert TOOL_CALL_ID in call["prompt_token_ids"][len(prev["prompt_token_ids"]):]
        assert call["metadata"]["fidelity"]["class"] == "replay_drift"
        # and the recorder says why, from the certified tool-call tag id and the ids
        assert call["metadata"]["fidelity"]["cause"] == "tag_sampled_as_text"


@pytest.mark.parametrize("harness", ["pi", "opencode"])
def test_trl_and_the_assembler_over_the_real_trace(harness: str, rollouts: dict[str, Any]) -> None:
    run = rollouts[harness]
    trace: TrainingTrace = run["trace"]
    agent = [r for r in run["records"] if r["metadata"]["call_kind"] == "agent"]
    assert len(trace.turns) == len(agent)
    turns = _turns_from_training_trace(trace)
    assert [t.prompt_ids for t in turns] == [r["prompt_token_ids"] for r in agent]
    assert [t.output_ids for t in turns] == [r["completion_token_ids"] for r in agent]
    sampled = sum(len(r["completion_token_ids"]) for r in agent)
    # every call ran under tool_choice "required": its logprobs are taken after the grammar's mask, not
    # the policy's, so by default TRL gets them mask 0 -- and keeps no row without a trainable token
    policy = sum(len(r["completion_token_ids"]) for r in agent if r["metadata"]["logprobs_are_policy"])
    assert policy == 0
    rows, tally = _chain_to_sequences(turns, "real", 0)
    assert tally["transitions"] == len(agent) - 1 and rows == []
    # with them kept (a trainer that recomputes old logprobs): fork threshold 0, every drifted transition
    # forks, one row per call, each sampled token once
    kept_rows, tally = _chain_to_sequences(_turns_from_training_trace(run["session_trace_keep"]), "real", 0)
    assert tally["transitions"] == len(agent) - 1 and tally["fork"] == len(agent) - 1 and tally["clean"] == 0
    assert len(kept_rows) == len(agent)
    assert sum(sum(r.completion_mask) for r in kept_rows) == sampled
    split = assemble_session(run["records"], strategy="split")
    assert len(split.traces) == len(agent)
    assert split.stats.trainable_tokens == policy and split.stats.non_policy_tokens == sampled
    assert all(not seg.logprobs_are_policy for t in split.traces for seg in t.metadata.segments)
    assert split.stats.replay_drift == len(agent) - 1
    # a trainer that recomputes the old logprobs itself may keep them: then every sampled token, once
    kept = assemble_session(run["records"], strategy="split", non_policy="keep")
    assert kept.stats.trainable_tokens == sampled
