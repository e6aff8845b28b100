"""The real, unmodified Codex and Claude Code CLIs through the recorder, as a trainer runs them.

Codex speaks the Responses API, Claude Code the Anthropic Messages API; both go through the same
flow as Pi and OpenCode. What each CLI does with the model's turn when it sends it back:
- Codex replays function-call ``arguments`` and reasoning text verbatim (we hand it the argument
  text the model sampled);
- Claude Code replays ``tool_use.input`` as a parsed object and thinking with its signature (the
  recorder restores the sampled argument text from its replay memory).
Both chains are exact when the model samples its arguments in the template's JSON style; what the
model sampled otherwise (non-canonical ids, other argument spacing) shows as drift, with its cause.
"""

from __future__ import annotations

import pytest
from openenv.core.harness import TrainingTrace, TrainingTurn

from openenv_harness.recorder import RecorderClient, RecorderServer
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.rollout.taskset import script_for
from openenv_harness.testing.engine import EngineServer, Fault, Script, ToolCallSpec, Turn, is_noncanonical, reference_tokenizer

from rollout_helpers import ADMIN

pytestmark = pytest.mark.cli
DIALECTS = {"codex": "responses", "claude-code": "anthropic"}
HARNESSES = ["codex", pytest.param("claude-code", marks=pytest.mark.slow)]  # a Claude Code run takes ~4 s


def factory_for(engine: EngineServer, recorder: RecorderServer, harness: str, label: str, script: Script,
                **kw) -> HarnessSessionFactory:
    model = f"dia-{harness}-{label}"
    engine.set_script(model, Script.model_validate({**script.model_dump(), "turns": script_for(script.turns, harness)}))
    return HarnessSessionFactory(harness=harness, recorder_url=recorder.url, admin_token=ADMIN, model=model, **kw)


def agent_entries(session) -> list[dict]:
    return [e for e in session.fetch_proxy_trace() if e["metadata"]["call_kind"] == "agent"]


@pytest.mark.parametrize("harness", HARNESSES)
def test_fix_a_failing_test(harness: str, cli_paths, engine: EngineServer, recorder: RecorderServer) -> None:
    task = BUILTIN_TASKS["fix-add"]
    factory = factory_for(engine, recorder, harness, "fix-add", Script(turns=task.reference_script))
    session = factory.create("fix-add", seed=3, episode_id="ep-1")
    try:
        code = session.wait_for_completion(timeout_s=120)
        stdout, stderr = session.agent.output()
        assert code == 0, (stdout[-2000:], stderr[-2000:])
        assert session.agent.result().final_answer == task.reference_script[-1]["content"]
        assert session.verify([]).env_reward == 1.0  # the task's own verifier
        assert "return a + b" in session.sandbox.read_file("calc.py").decode()
        entries = session.fetch_proxy_trace()
        agent = [e for e in entries if e["metadata"]["call_kind"] == "agent"]
        assert len(entries) == len(agent) == 4  # three shell turns and the answer; no aux call headless
        sampled = [r["sampled"] for r in engine.requests(factory.model)]
        for e, s in zip(agent, sampled, strict=True):
            assert e["prompt_token_ids"] == s["prompt_token_ids"]  # the engine's canonical ids
            assert e["completion_token_ids"] == s["token_ids"] and e["per_token_logps"] == s["logprobs"]
            md = e["metadata"]
            assert md["dialect"] == DIALECTS[harness] and md["stream"] is True and md["harness_session_id"]
            assert md["provenance"]["harness"] == harness and md["provenance"]["config_hashes"]
        assert [e["metadata"]["fidelity"]["class"] for e in agent] == ["root", "exact", "exact", "exact"]
        for prev, nxt in zip(agent, agent[1:]):
            head = prev["prompt_token_ids"] + prev["completion_token_ids"]
            assert nxt["prompt_token_ids"][: len(head)] == head
        trace = session.fetch_training_trace()
        assert isinstance(trace, TrainingTrace) and [t.node_id for t in trace.turns] == [
            e["metadata"]["node_id"] for e in agent]
        for turn in trace.turns:  # each record is valid under OpenEnv's own TrainingTurn
            assert TrainingTurn.model_validate(turn.model_dump()) == turn
    finally:
        session.close()


@pytest.mark.parametrize("harness", HARNESSES)
def test_sampled_argument_text_survives_each_clis_replay(harness: str, cli_paths, engine: EngineServer,
                                                         recorder: RecorderServer) -> None:
    raw = '{"command":  "printf hi > out.txt"}'  # spacing the engine's parser (json.dumps) would not keep
    script = Script(turns=[Turn(reasoning="Write the file.", tool_calls=[ToolCallSpec(name="bash", arguments=raw)]),
                           Turn(content="Wrote out.txt.")])
    session = factory_for(engine, recorder, harness, "raw-args", script).create("write-greeting")
    try:
        assert session.wait_for_completion(timeout_s=120) == 0
        assert session.sandbox.read_file("out.txt") == b"hi"
        first, second = agent_entries(session)
        name, argument = ("exec_command", "cmd") if harness == "codex" else ("Bash", "command")
        sampled = raw.replace('"command"', f'"{argument}"')
        assert sampled in reference_tokenizer().decode(first["completion_token_ids"])
        parsed = first["response"]["choices"][0]["message"]["tool_calls"][0]["function"]
        assert parsed["name"] == name and parsed["arguments"] != sampled  # the parser re-serialized it
        replayed = [m for m in second["request"]["messages"] if m["role"] == "assistant"][-1]
        assert replayed["tool_calls"][0]["function"]["arguments"] == sampled  # what the model sampled
        assert replayed["reasoning"] == "Write the file."
        # the engine's template (like vLLM's Qwen2.5) parses the replayed text and renders it in its own JSON
        # style: the sampled spacing cannot survive, and the recorder says so (a verbatim template keeps the
        # chain exact: tests/recorder/dialects)
        fidelity = second["metadata"]["fidelity"]
        assert (fidelity["class"], fidelity["cause"]) == ("replay_drift", "tool_arguments_restyled")
    finally:
        session.close()


@pytest.mark.parametrize("harness", HARNESSES)
def test_non_canonical_sampling_is_recorded_verbatim_and_seen_as_drift(harness: str, cli_paths, engine: EngineServer,
                                                                       recorder: RecorderServer) -> None:
    script = Script(turns=BUILTIN_TASKS["write-greeting"].reference_script, segmentation="noncanonical")
    factory = factory_for(engine, recorder, harness, "noncanonical", script)
    session = factory.create("write-greeting")
    try:
        assert session.wait_for_completion(timeout_s=120) == 0
        assert session.verify([]).env_reward == 1.0
        agent = agent_entries(session)
        sampled = [r["sampled"] for r in engine.requests(factory.model)]
        assert [e["completion_token_ids"] for e in agent] == [s["token_ids"] for s in sampled]
        assert is_noncanonical(reference_tokenizer(), agent[0]["completion_token_ids"])
        assert agent[1]["metadata"]["fidelity"]["class"] == "replay_drift"
    finally:
        session.close()


@pytest.mark.parametrize("harness", HARNESSES)
def test_budget_stop_ends_the_cli_promptly(harness: str, cli_paths, engine: EngineServer, recorder: RecorderServer,
                                           admin: RecorderClient) -> None:
    loop = Script(turns=[Turn(tool_calls=[ToolCallSpec(name="bash", arguments={"command": "echo again"})])],
                  repeat_last=True)
    session = factory_for(engine, recorder, harness, "budget", loop, budgets={"max_agent_calls": 3}).create(
        "write-greeting")
    try:
        code = session.wait_for_completion(timeout_s=90)
        assert code != 0
        info = admin.session(session.session_id)
        assert info["stop_reason"] == "max_agent_calls" and info["agent_calls"] == 3
        assert len(agent_entries(session)) == 3  # nothing synthetic, no retry storm recorded
        assert len([r for r in engine.requests() if r["model"] == f"dia-{harness}-budget"]) == 3
        result = session.agent.result()
        assert not result.ok and "budget" in (result.error or "")
    finally:
        session.close()


@pytest.mark.parametrize("harness", HARNESSES)
def test_engine_fault_surfaces_as_the_sessions_error(harness: str, cli_paths, engine: EngineServer,
                                                     recorder: RecorderServer, admin: RecorderClient) -> None:
    factory = factory_for(engine, recorder, harness, "fault", Script(turns=BUILTIN_TASKS["fix-add"].reference_script))
    # persistent: Claude Code answers a 400 by retrying the turn itself (up to 5 times, as if its prompt
    # were too long), Codex gives up at once; either way the run fails and the session names the error
    engine.add_fault(factory.model, Fault(status=400, message="prompt too long for this engine", on_turn=1, count=20))
    session = factory.create("fix-add")
    try:
        assert session.wait_for_completion(timeout_s=90) != 0
        info = admin.session(session.session_id)
        assert info["last_error"]["status"] == 400 and "prompt too long" in info["last_error"]["message"]
        result = session.agent.result()
        assert not result.ok and "prompt too long" in (result.error or ""), result
        records = admin.records(session.session_id)
        statuses = [r["metadata"]["status"] for r in records]
        assert statuses[0] == "ok" and len(statuses) > 1 and set(statuses[1:]) == {"failed"}
        assert len(statuses) == (2 if harness == "codex" else 7), statuses
    finally:
        session.close()
