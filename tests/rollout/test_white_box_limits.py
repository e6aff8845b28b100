"""Every RFC 005 run limit, enforced on the real Pi and OpenCode CLIs against the reference engine.

The engine's scripts make the model ask for two tool calls in one turn; each tool call writes a
file, and the task's verifier checks which files exist -- so the sandbox itself shows which calls
the agent really ran. The result must say what happened: the cut, the stop reason, the agent's
verdict as ``exit_code`` and the tool calls it received.
"""

from __future__ import annotations

import itertools
import json

import pytest
from openenv.core.harness import HarnessRunLimits

from openenv_harness.rollout import AgentCLIAdapter, TaskSession
from openenv_harness.rollout.tasks import Task
from openenv_harness.testing.engine import EngineServer, Script, reference_tokenizer
from openenv_harness.testing.model_step import ScriptedModelStep

pytestmark = pytest.mark.cli

HARNESSES = ["pi", "opencode"]
_RUNS = itertools.count()


def bash(*commands: str) -> dict:
    return {"tool_calls": [{"name": "bash", "arguments": json.dumps({"command": c}, separators=(",", ":"))}
                           for c in commands]}


def task(task_id: str, verify: str) -> Task:
    return Task(id=task_id, instruction="Create the files a.txt and b.txt.", verify_command=verify)


def run(engine: EngineServer, harness: str, script: list[dict], limits: HarnessRunLimits, verify: str):
    model = f"ref-{harness}-limits-{next(_RUNS)}"
    engine.set_script(model, Script(turns=script))
    adapter = AgentCLIAdapter(harness, engine_url=engine.url, model=model, timeout_s=120)
    try:
        return adapter.run_black_box(TaskSession(task("two-files", verify)), limits)
    finally:
        adapter.close()


def commands(result) -> list[str]:
    return [entry.arguments.get("command") for entry in result.tool_trace]


ONLY_A = "test -f a.txt && test ! -f b.txt"


@pytest.mark.parametrize("harness", HARNESSES)
def test_max_tool_calls_per_turn_runs_only_the_first_calls(harness: str, engine: EngineServer, cli_paths) -> None:
    result = run(engine, harness, [bash("echo one > a.txt", "echo two > b.txt"), {"content": "Both created."}],
                 HarnessRunLimits(max_turns=8, max_tool_calls_per_turn=1), ONLY_A)
    m = result.metrics
    assert m["env_reward"] == 1.0, m["verify"]  # a.txt was written, b.txt never was
    assert m["agent_ok"] and m["exit_code"] == 0 and result.done, m
    assert m["stop_reason"] is None and not m["truncated"] and m["tool_calls_cut"] == 1
    cut = [e.payload for e in result.events if e.type == "tool_calls_cut"]
    assert cut == [{"node_id": f"{m['session_id']}/0", "cap": "max_tool_calls_per_turn", "sampled": 2,
                    "delivered": 1}]
    assert commands(result) == ["echo one > a.txt"] and result.tool_trace[0].tool_name == "bash"
    assert result.tool_trace[0].result.metadata["result_seen"] is True  # the agent's next call carried it
    first = [r for r in m["trace_entries"] if r["metadata"]["call_kind"] == "agent"][0]
    assert first["metadata"]["tool_limit"]["dropped"][0]["function"]["name"] == "bash"


@pytest.mark.parametrize("harness", HARNESSES)
def test_max_total_tool_calls_runs_what_fits_then_stops(harness: str, engine: EngineServer, cli_paths) -> None:
    result = run(engine, harness, [bash("echo one > a.txt", "echo two > b.txt"), {"content": "Both created."}],
                 HarnessRunLimits(max_turns=8, max_total_tool_calls=1), ONLY_A)
    m = result.metrics
    assert m["env_reward"] == 1.0, m["verify"]
    assert m["stop_reason"] == "max_total_tool_calls" and m["truncated"] and not result.done
    assert {"type": "stopped", "payload": {"reason": "max_total_tool_calls"}} in [vars(e) for e in result.events]
    # the agent ran the call it got; its next model call was refused, so it failed -- and says so
    assert not m["agent_ok"] and m["exit_code"] != 0 and m["agent_calls"] == 1, m
    if harness == "pi":
        assert m["process_exit_code"] == 0  # Pi exits 0 on failure: exit_code is its verdict, not this
    assert commands(result) == ["echo one > a.txt"]
    assert result.tool_trace[0].result.metadata["result_seen"] is False  # the refused call is not a record
    assert m["unscored_reason"] is None  # a limit is the policy's doing: the run is scored


@pytest.mark.parametrize("harness", HARNESSES)
def test_max_total_tool_calls_with_no_room_left_ends_the_agents_turn(harness: str, engine: EngineServer,
                                                                    cli_paths) -> None:
    result = run(engine, harness, [bash("echo one > a.txt"), bash("echo two > b.txt"), {"content": "Done."}],
                 HarnessRunLimits(max_turns=8, max_total_tool_calls=1), ONLY_A)
    m = result.metrics
    assert m["env_reward"] == 1.0, m["verify"]
    assert m["stop_reason"] == "max_total_tool_calls" and not result.done
    assert m["agent_calls"] == 2 and m["tool_calls_cut"] == 1 and commands(result) == ["echo one > a.txt"]
    second = [r for r in m["trace_entries"] if r["metadata"]["call_kind"] == "agent"][1]
    assert second["metadata"]["tool_limit"]["delivered"] == 0
    assert m["exit_code"] is not None and (m["exit_code"] == 0) == m["agent_ok"]


@pytest.mark.parametrize("harness", HARNESSES)
def test_max_turns_stops_the_agent_and_the_result_says_so(harness: str, engine: EngineServer, cli_paths) -> None:
    result = run(engine, harness, [bash("echo one > a.txt"), bash("echo two > b.txt"), {"content": "Done."}],
                 HarnessRunLimits(max_turns=1), ONLY_A)
    m = result.metrics
    assert m["stop_reason"] == "max_agent_calls" and m["truncated"] and not result.done
    assert m["agent_calls"] == 1 and m["env_reward"] == 1.0
    assert not m["agent_ok"] and m["exit_code"] != 0, m
    if harness == "pi":
        assert m["process_exit_code"] == 0
    assert "max_agent_calls" in (m["error"] or ""), m["error"]


@pytest.mark.parametrize("harness", HARNESSES)
def test_white_box_with_both_tool_limits_at_one(harness: str, cli_paths) -> None:
    """The trainer's ModelStep asks for two tool calls, then one more: only the very first runs."""
    step = ScriptedModelStep([["echo one > a.txt", "echo two > b.txt"], "echo three > c.txt"], "Done.")
    adapter = AgentCLIAdapter(harness, timeout_s=120)
    try:
        result = adapter.run_white_box(step, TaskSession(task("two-files", ONLY_A + " && test ! -f c.txt")),
                                       HarnessRunLimits(max_turns=8, max_tool_calls_per_turn=1, max_total_tool_calls=1))
    finally:
        adapter.close()
    m = result.metrics
    assert m["env_reward"] == 1.0, m["verify"]
    assert [e.payload["cap"] for e in result.events if e.type == "tool_calls_cut"] \
        == ["max_tool_calls_per_turn", "max_total_tool_calls"]
    assert m["stop_reason"] == "max_total_tool_calls" and not result.done
    assert commands(result) == ["echo one > a.txt"] and len(step.calls) == m["agent_calls"] == 2
    # the record still holds what the ModelStep sampled: both calls of turn 0 are in its ids
    entries = [e for e in m["trace_entries"] if e["metadata"]["call_kind"] == "agent"]
    assert result.completion_ids[:len(entries[0]["completion_token_ids"])] == entries[0]["completion_token_ids"]
    assert "echo two" in reference_tokenizer().decode(entries[0]["completion_token_ids"])
