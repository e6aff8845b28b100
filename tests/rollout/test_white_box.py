"""RFC 005 white-box mode: the real CLI runs unmodified while the trainer's ModelStep samples each turn."""

from __future__ import annotations

from pathlib import Path

import pytest
from openenv.core.env_server.mcp_types import Tool
from openenv.core.harness import HarnessRolloutResult, HarnessRunLimits, ModelStepResult

from openenv_harness.contract import is_training_entry
from openenv_harness.recorder import RecorderClient
from openenv_harness.rollout import BUILTIN_TASKS, AgentCLIAdapter, TaskSession
from openenv_harness.testing.model_step import ScriptedModelStep

pytestmark = pytest.mark.cli


@pytest.mark.parametrize("harness", ["pi", "opencode"])
def test_run_white_box_with_a_model_step(harness: str, cli_paths) -> None:
    task = BUILTIN_TASKS["fix-add"]
    step = ScriptedModelStep(["sed -i 's/return a - b/return a + b/' calc.py", "python3 -m unittest -q"], "Fixed.")
    adapter = AgentCLIAdapter(harness, timeout_s=120)
    try:
        limits = HarnessRunLimits(max_turns=8, sampling={"temperature": 1.0})
        result = adapter.run_white_box(step, TaskSession(task), limits)
        assert isinstance(result, HarnessRolloutResult) and result.done
        m = result.metrics
        assert m["exit_code"] == 0 and m["agent_ok"], m
        assert m["env_reward"] == 1.0  # the environment's verifier ran in the agent's sandbox
        assert m["agent_calls"] == 3 == len(step.calls)
        # ModelStep got OpenEnv Tool objects (the agent's own tools) and the limits' sampling
        turn0_tools = step.calls[0][1]
        assert all(isinstance(t, Tool) for t in turn0_tools) and "bash" in {t.name for t in turn0_tools}
        assert step.calls[0][2]["temperature"] == 1.0
        entries = [e for e in m["trace_entries"] if is_training_entry(e)]
        assert result.prompt_ids == sum((e["prompt_token_ids"] for e in entries), [])
        assert result.completion_ids == sum((e["completion_token_ids"] for e in entries), [])
        assert result.logprobs == pytest.approx(sum((e["per_token_logps"] for e in entries), []))
        assert [ev.payload["fidelity"]["class"] for ev in result.events if ev.type == "model_call"] \
            == ["root", "exact", "exact"]
        assert [e.arguments["command"] for e in result.tool_trace] == step.commands  # as the recorder saw them
        assert all(e.result.metadata["result_seen"] and e.result.data is not None for e in result.tool_trace)
        assert m["stop_reason"] is None and m["error"] is None and m["errors"] == []
        assert result.messages[-1]["content"] == "Fixed."
        assert all(e["metadata"]["provenance"]["engine"].startswith("model_step") for e in entries)
    finally:
        adapter.close()


def test_run_black_box_uses_the_engine(cli_paths, tmp_path) -> None:
    from openenv_harness.testing.engine import EngineServer, Script

    task = BUILTIN_TASKS["write-greeting"]
    with EngineServer() as engine:
        engine.set_script("ref-greeting", Script(turns=task.reference_script))
        with AgentCLIAdapter("pi", engine_url=engine.url, model="ref-greeting", timeout_s=120) as adapter:
            result = adapter.run_black_box(TaskSession(task))
            assert result.metrics["env_reward"] == 1.0 and result.metrics["agent_calls"] == 2
            assert result.completion_ids and len(result.completion_ids) == len(result.logprobs)
            with RecorderClient(adapter.recorder().url, adapter.recorder().admin_token) as admin:
                info = admin.session(result.metrics["session_id"])
                assert info["status"] == "closed" and info["agent_calls"] == 2
            store = Path(adapter.recorder().ctx.config.store_path)
            assert store.exists()
        # the adapter's own temporary store goes with it; the result kept what it needed
        assert not store.parent.exists() and result.metrics["trace_entries"]


class FailingModelStep(ScriptedModelStep):
    """Samples turn 0, then raises: the trainer's sampler failing mid-rollout."""

    def __call__(self, messages: list[dict], tools: list[Tool], sampling: dict) -> ModelStepResult:
        if any(m.get("role") == "assistant" for m in messages):
            self.calls.append((1, tools, sampling))
            raise RuntimeError("policy forward pass ran out of memory")
        return super().__call__(messages, tools, sampling)


@pytest.mark.parametrize("harness", ["pi", "opencode"])
def test_a_model_step_that_raises_leaves_its_cause_in_the_result(harness: str, cli_paths) -> None:
    step = FailingModelStep(["echo hi > hi.txt"], "unreachable")
    adapter = AgentCLIAdapter(harness, timeout_s=120)
    try:
        result = adapter.run_white_box(step, TaskSession(BUILTIN_TASKS["write-greeting"]),
                                       HarnessRunLimits(max_turns=8))
    finally:
        adapter.close()
    m = result.metrics
    cause = "model_step raised RuntimeError: policy forward pass ran out of memory"
    assert m["error"] is not None and cause in m["error"], m["error"]
    assert not m["agent_ok"] and m["exit_code"] != 0 and not result.done
    failed = [e.payload for e in result.events if e.type == "model_call_failed"]
    assert failed and all(cause in f["message"] for f in failed) and m["failed_calls"] == len(failed)
    assert len(m["errors"]) == len(failed) == len(step.calls) - 1  # every attempt the agent made is there
    records = m["trace_entries"]
    assert [r["metadata"]["status"] for r in records if r["metadata"]["call_kind"] == "agent"] \
        == ["ok"] + ["failed"] * len(failed)
    assert [e.type for e in result.events if e.type == "model_call"] == ["model_call"]  # turn 0 still trains
    assert m["env_reward"] is None and cause in m["unscored_reason"]  # a trainer fault is not a score of 0
