"""An incremental Pi rollout on the real stack, and what makes it one exact chain (shared by the
generate-route and the id-prompt-completions tests)."""

from __future__ import annotations

import os
from typing import Any

from openenv.core.harness import TrainingTrace
from real_stack import MODEL, RealStack
from openenv_harness.cli.stack import REAL_ENGINE_SAMPLING
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.rollout.report import run_rollout

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl.experimental.async_grpo.async_rollout_worker import _chain_to_sequences  # noqa: E402
from trl.experimental.async_grpo.openenv_harness import _turns_from_training_trace  # noqa: E402

TOOL_CALL_ID = 151657  # <tool_call> in the Qwen2.5 vocabulary


def run_incremental_pi(stack: RealStack) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    """A strict incremental Pi rollout of fix-add (3 agent calls at most): (records, agent records, trace)."""
    factory = HarnessSessionFactory(harness="pi", recorder_url=stack.recorder.url, admin_token=stack.admin_token,
                                    model=MODEL, tasks={"fix-add": BUILTIN_TASKS["fix-add"]},
                                    budgets={"max_agent_calls": 3, "max_wall_clock_s": 400},
                                    sampling=dict(REAL_ENGINE_SAMPLING), prompt_mode="incremental",
                                    prompt_mode_strict=True)
    report, session = run_rollout(factory, "fix-add", timeout_s=450)
    assert session is not None, report.error
    trace = session.fetch_training_trace()  # what TRL gets by default
    # the same with the constrained calls' ids kept trainable (their logprobs are post-mask, not the policy's)
    kept = TrainingTrace.model_validate(session.client.training_trace_json(session.session_id, non_policy="keep"))
    records = stack.admin.records(session.session_id)
    session.close()
    agent = [r for r in records if r["metadata"]["call_kind"] == "agent"]
    assert len(agent) >= 2, [r["metadata"]["status"] for r in records]
    return records, agent, (trace, kept)


def assert_one_exact_chain(agent: list[dict[str, Any]], traces: tuple[Any, Any], name: str) -> None:
    """Root then exact transitions, each continued from exactly the previous prompt + sampled ids
    (the tag sampled as text, where a full render would have drifted), and TRL's reconciler sees
    one clean row training every sampled token."""
    assert [r["metadata"]["prompt_mode"]["continued"] for r in agent] == [False] + [True] * (len(agent) - 1)
    assert [r["metadata"]["fidelity"]["class"] for r in agent] == ["root"] + ["exact"] * (len(agent) - 1)
    # Qwen2.5's template renders the new messages alike without the tool list: the probe leaves it out
    assert not any(r["metadata"]["prompt_mode"]["probe_rendered_tools"] for r in agent[1:])
    for prev, call in zip(agent, agent[1:]):
        assert TOOL_CALL_ID not in prev["completion_token_ids"]  # the tag was sampled as text ...
        chain = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert call["prompt_token_ids"][:len(chain)] == chain  # ... and the engine continued from exactly that
        diff = call["metadata"]["prompt_mode"]["full_render_diff"]
        assert diff["identical"] is False and diff["position"] < len(chain)  # a full render would have drifted
    trace, kept = traces
    rows, tally = _chain_to_sequences(_turns_from_training_trace(kept), name, 0)
    assert tally["clean"] == len(agent) - 1 and tally["fork"] == 0.0 and len(rows) == 1
    assert sum(rows[0].completion_mask) == sum(len(r["completion_token_ids"]) for r in agent)
    # by default a call under tool_choice "required" (post-mask logprobs) is mask 0 in the training trace
    # (contract.training_loss_mask): TRL trains only the policy's tokens, and keeps no row without any
    policy = sum(len(r["completion_token_ids"]) for r in agent if r["metadata"]["logprobs_are_policy"])
    default_rows, _ = _chain_to_sequences(_turns_from_training_trace(trace), name, 0)
    assert sum(sum(r.completion_mask) for r in default_rows) == policy
