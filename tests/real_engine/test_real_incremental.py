"""An incremental Pi rollout on the real vLLM (--enable-scale-out): exact chains where full history drifts.

With ``tool_choice: "required"`` pinned, this stack drifts at every tool turn in full history (the
grammar makes the model sample the ``<tool_call>`` tag as text pieces; the template re-renders it as
the special id, ``test_real_rollouts.py``). In incremental mode the engine continues from the exact
ids it sampled: every transition is exact, TRL's reconciler sees only CLEAN transitions and trains
every sampled token in one row; the records say where vLLM's own full render would have differed.
"""

from __future__ import annotations

import os

import pytest

from real_stack import MODEL, RealStack
from openenv_harness.cli.stack import REAL_ENGINE_SAMPLING
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.rollout.report import run_rollout

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl.experimental.async_grpo.async_rollout_worker import _chain_to_sequences  # noqa: E402
from trl.experimental.async_grpo.openenv_harness import _turns_from_training_trace  # noqa: E402

pytestmark = [pytest.mark.real_engine, pytest.mark.cli, pytest.mark.compat, pytest.mark.slow]

TOOL_CALL_ID = 151657  # <tool_call> in the Qwen2.5 vocabulary


def test_an_incremental_pi_rollout_is_one_exact_chain(stack: RealStack) -> None:
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
    agent = [r for r in records if r["metadata"]["call_kind"] == "agent"]
    assert len(agent) >= 2, [r["metadata"]["status"] for r in records]
    assert [r["metadata"]["fidelity"]["class"] for r in agent] == ["root"] + ["exact"] * (len(agent) - 1)
    assert [r["metadata"]["prompt_mode"]["continued"] for r in agent] == [False] + [True] * (len(agent) - 1)
    for prev, call in zip(agent, agent[1:]):
        assert TOOL_CALL_ID not in prev["completion_token_ids"]  # the tag was sampled as text ...
        chain = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert call["prompt_token_ids"][:len(chain)] == chain  # ... and the engine continued from exactly that
        diff = call["metadata"]["prompt_mode"]["full_render_diff"]
        assert diff["identical"] is False and diff["position"] < len(chain)  # a full render would have drifted
    turns = _turns_from_training_trace(trace)
    rows, tally = _chain_to_sequences(turns, "real-incremental", 0)
    assert tally["clean"] == len(agent) - 1 and tally["fork"] == 0.0 and len(rows) == 1
    assert sum(rows[0].completion_mask) == sum(len(r["completion_token_ids"]) for r in agent)
