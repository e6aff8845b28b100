"""The real, unmodified Pi and OpenCode CLIs through the recorder, as a trainer runs them."""

from __future__ import annotations

import time

import pytest
from openenv.core.harness import LoopOwningSession, ResourceSession, TrainableSession, TrainingTrace

from openenv_harness.recorder import RecorderClient, RecorderServer
from openenv_harness.testing.engine import EngineServer, Fault, Script, ToolCallSpec, Turn, is_noncanonical, reference_tokenizer

from rollout_helpers import scripted_factory

pytestmark = pytest.mark.cli
HARNESSES = ["pi", "opencode"]


@pytest.mark.parametrize("harness", HARNESSES)
def test_fix_a_failing_test(harness: str, cli_paths, engine: EngineServer, recorder: RecorderServer,
                            admin: RecorderClient) -> None:
    factory = scripted_factory(engine, recorder, harness, "fix-add")
    session = factory.create("fix-add", seed=3, episode_id="ep-1")
    try:
        assert isinstance(session, ResourceSession)
        assert isinstance(session, TrainableSession) and isinstance(session, LoopOwningSession)
        code = session.wait_for_completion(timeout_s=120)
        stdout, stderr = session.agent.output()
        assert code == 0, (stdout[-2000:], stderr[-2000:])
        verified = session.verify([])
        assert verified.env_reward == 1.0, verified.artifacts
        assert "return a + b" in session.sandbox.read_file("calc.py").decode()
        entries = session.fetch_proxy_trace()
        agent = [e for e in entries if e["metadata"]["call_kind"] == "agent"]
        assert len(agent) == 4  # three bash turns and the final answer
        sampled = [r["sampled"] for r in engine.requests(factory.model)][-len(agent):]
        for e, s in zip(agent, sampled):
            assert e["prompt_token_ids"] == s["prompt_token_ids"]  # canonical prompt ids, as the engine saw
            assert e["completion_token_ids"] == s["token_ids"]  # sampled ids, verbatim
            assert e["metadata"]["stream"] is True  # the CLIs stream; we synthesized SSE
            assert e["metadata"]["provenance"]["harness"] == harness
            assert e["metadata"]["provenance"]["config_hashes"]
        # canonical sampling, compact tool JSON: each prompt extends the previous prompt + sampled ids
        assert [e["metadata"]["fidelity"]["class"] for e in agent] == ["root", "exact", "exact", "exact"]
        for prev, nxt in zip(agent, agent[1:]):
            head = prev["prompt_token_ids"] + prev["completion_token_ids"]
            assert nxt["prompt_token_ids"][: len(head)] == head
        trace = session.fetch_training_trace()
        assert isinstance(trace, TrainingTrace) and [t.node_id for t in trace.turns] == [
            e["metadata"]["node_id"] for e in agent]
        assert all(e["metadata"]["task_id"] == "fix-add" for e in [{"metadata": session.client.session(session.session_id)["metadata"]}])
    finally:
        session.close()


@pytest.mark.parametrize("harness", HARNESSES)
def test_non_canonical_sampling_is_recorded_verbatim_and_seen_as_drift(harness: str, cli_paths, engine: EngineServer,
                                                                       recorder: RecorderServer) -> None:
    factory = scripted_factory(engine, recorder, harness, "write-greeting", segmentation="noncanonical")
    session = factory.create("write-greeting")
    try:
        assert session.wait_for_completion(timeout_s=120) == 0
        assert session.verify([]).env_reward == 1.0
        agent = [e for e in session.fetch_proxy_trace() if e["metadata"]["call_kind"] == "agent"]
        sampled = [r["sampled"] for r in engine.requests(factory.model)][-len(agent):]
        tok = reference_tokenizer()
        assert [e["completion_token_ids"] for e in agent] == [s["token_ids"] for s in sampled]
        assert is_noncanonical(tok, agent[0]["completion_token_ids"])
        assert agent[1]["metadata"]["fidelity"]["class"] == "replay_drift"
    finally:
        session.close()


@pytest.mark.parametrize("harness", HARNESSES)
def test_rewritten_tool_json_never_replaces_the_sampled_ids(harness: str, cli_paths, engine: EngineServer,
                                                            recorder: RecorderServer) -> None:
    # sampled with odd spacing: the CLIs replay it compact, and vLLM re-renders that replay with tojson's
    # single spaces, so neither gives the sampled bytes back
    raw = '{"command":  "printf hi > out.txt"}'
    script = Script(turns=[Turn(tool_calls=[ToolCallSpec(name="bash", arguments=raw)]), Turn(content="Wrote out.txt.")])
    factory = scripted_factory(engine, recorder, harness, "write-greeting", script=script)
    session = factory.create("write-greeting")
    try:
        assert session.wait_for_completion(timeout_s=120) == 0
        agent = [e for e in session.fetch_proxy_trace() if e["metadata"]["call_kind"] == "agent"]
        tok = reference_tokenizer()
        assert raw in tok.decode(agent[0]["completion_token_ids"])  # what the model sampled, spaces included
        replayed = agent[1]["request"]["messages"]
        echoed = [m for m in replayed if m.get("role") == "assistant"][-1]["tool_calls"][0]["function"]["arguments"]
        assert echoed == '{"command":"printf hi > out.txt"}'  # the CLI's re-serialization
        assert agent[1]["metadata"]["fidelity"]["class"] == "replay_drift"
        assert session.sandbox.read_file("out.txt") == b"hi"
    finally:
        session.close()


@pytest.mark.parametrize("harness", HARNESSES)
def test_budget_stop_ends_the_cli_promptly(harness: str, cli_paths, engine: EngineServer, recorder: RecorderServer,
                                           admin: RecorderClient) -> None:
    loop = Script(turns=[Turn(tool_calls=[ToolCallSpec(name="bash", arguments={"command": "echo again"})])],
                  repeat_last=True)
    factory = scripted_factory(engine, recorder, harness, "write-greeting", script=loop,
                               budgets={"max_agent_calls": 3})
    session = factory.create("write-greeting")
    try:
        started = time.monotonic()
        code = session.wait_for_completion(timeout_s=90)
        assert time.monotonic() - started < 60  # no retry storm, no infinite loop
        assert code != 0
        info = admin.session(session.session_id)
        assert info["stop_reason"] == "max_agent_calls" and info["agent_calls"] == 3
        records = admin.records(session.session_id)
        assert len([r for r in records if r["metadata"]["call_kind"] == "agent"]) == 3  # nothing synthetic
        assert session.verify([]).env_reward == 0.0  # the environment scores what the agent left behind
    finally:
        session.close()


@pytest.mark.parametrize("harness", HARNESSES)
def test_engine_fault_surfaces_as_the_sessions_error(harness: str, cli_paths, engine: EngineServer,
                                                     recorder: RecorderServer, admin: RecorderClient) -> None:
    factory = scripted_factory(engine, recorder, harness, "fix-add")
    engine.add_fault(factory.model, Fault(status=400, message="prompt too long for this engine", on_turn=1, count=1))
    session = factory.create("fix-add")
    try:
        code = session.wait_for_completion(timeout_s=90)
        assert code != 0
        info = admin.session(session.session_id)
        assert info["last_error"]["status"] == 400 and "prompt too long" in info["last_error"]["message"]
        result = session.agent.result()
        assert not result.ok and result.error
    finally:
        session.close()
