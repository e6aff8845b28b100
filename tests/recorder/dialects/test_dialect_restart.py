"""A dialect episode across a recorder restart: the next call still chains exactly.

Why: Claude Code replays a ``tool_use`` as a parsed ``input`` object and may send a thinking block
back with only its ``signature``; Codex may keep a reasoning item by its ``encrypted_content``
alone. Only what the recorder remembered of its replies turns those back into the sampled text --
after a restart that memory is rebuilt from the session's durable records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineConfig, EngineServer, Script, ToolCallSpec, Turn

from agentloop import ADMIN
from dialect_clients import AnthropicAgent, GeminiAgent, ResponsesAgent

SPACED = '{"command":  "ls -la"}'  # as sampled; the engine's parser re-serializes it (one space)
COMPACT = '{"cmd":"ls -la"}'  # as sampled; the parser returns '{"cmd": "ls -la"}'


@pytest.fixture
def engine() -> Iterator[EngineServer]:
    """Verbatim tool arguments: the sampled text the dialect restores reaches the template unchanged."""
    with EngineServer(EngineConfig(tool_arguments="verbatim")) as e:
        yield e


def _config(tmp_path: Path, engine: EngineServer) -> RecorderConfig:
    return RecorderConfig(store_path=str(tmp_path / "records.db"), engine_url=engine.url, admin_token=ADMIN)


def _script(tool: str, arguments: str) -> Script:
    return Script(turns=[Turn(reasoning="Look first.", tool_calls=[ToolCallSpec(name=tool, arguments=arguments)]),
                         Turn(content="Fixed.")])


@pytest.mark.parametrize("stream", [True, False])
def test_gemini_replay_after_a_restart_is_restored_and_exact(stream: bool, tmp_path: Path, engine: EngineServer) -> None:
    config = _config(tmp_path, engine)
    with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as admin:
        s = admin.create_session()
        engine.set_script(s["session_id"], _script("run_shell_command", SPACED))
        agent = GeminiAgent(f"{server.url}/rollout/{s['session_id']}", s["secret"], stream=stream)
        first = agent.call()
    thought, call = first["candidates"][0]["content"]["parts"]
    assert call["functionCall"]["args"] == {"command": "ls -la"}

    with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as admin:
        agent.url = agent.url.replace(agent.url.split("/rollout/")[0], server.url)
        # Gemini CLI's replay: the parsed args, and the thought kept only by its signature
        agent.body["contents"] += [
            {"role": "model", "parts": [{"thought": True, "thoughtSignature": thought["thoughtSignature"]}, call]},
            {"role": "user", "parts": [{"functionResponse": {"id": call["functionCall"]["id"],
                                                             "name": "run_shell_command", "response": {"output": "ok"}}}]}]
        last = agent.call()
        records = admin.records(s["session_id"])
    assert last["candidates"][0]["content"]["parts"] == [{"text": "Fixed."}]
    assistant = records[1]["request"]["messages"][2]
    assert assistant["reasoning"] == "Look first."
    assert assistant["tool_calls"][0]["function"]["arguments"] == SPACED
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact"]


@pytest.mark.parametrize("stream", [True, False])
def test_anthropic_replay_after_a_restart_is_restored_and_exact(stream: bool, tmp_path: Path,
                                                                 engine: EngineServer) -> None:
    config = _config(tmp_path, engine)
    with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as admin:
        s = admin.create_session()
        engine.set_script(s["session_id"], _script("Bash", SPACED))
        agent = AnthropicAgent(f"{server.url}/rollout/{s['session_id']}/v1", s["secret"], stream=stream)
        first = agent.call()
    thinking, use = first["content"]
    assert thinking["type"] == "thinking" and use["input"] == {"command": "ls -la"}

    with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as admin:
        agent.url = f"{server.url}/rollout/{s['session_id']}/v1/messages"
        # Claude Code's replay: the parsed input, and the thinking block kept only by its signature
        agent.body["messages"] += [{"role": "assistant", "content": [{**thinking, "thinking": ""}, use]},
                                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                                 "content": "ok"}]}]
        last = agent.call()
        records = admin.records(s["session_id"])
    assert last["content"] == [{"type": "text", "text": "Fixed."}]
    assistant = records[1]["request"]["messages"][2]
    assert assistant["reasoning"] == "Look first."
    assert assistant["tool_calls"][0]["function"]["arguments"] == SPACED
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact"]
    assert records[1]["metadata"]["fidelity"]["parent"] == records[0]["metadata"]["node_id"]


def test_responses_reasoning_kept_by_handle_after_a_restart_is_restored_and_exact(tmp_path: Path,
                                                                                  engine: EngineServer) -> None:
    config = _config(tmp_path, engine)
    with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as admin:
        s = admin.create_session()
        engine.set_script(s["session_id"], _script("exec_command", COMPACT))
        agent = ResponsesAgent(f"{server.url}/rollout/{s['session_id']}/v1", s["secret"], stream=False)
        first = agent.call()
    reasoning, call = first["output"]
    assert call["arguments"] == COMPACT and reasoning["encrypted_content"]

    with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as admin:
        agent.url = f"{server.url}/rollout/{s['session_id']}/v1/responses"
        # the reasoning item by its handle alone, the call re-serialized
        agent.body["input"] += [{**reasoning, "content": []}, {**call, "arguments": '{"cmd": "ls -la"}'},
                                {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}]
        agent.call()
        records = admin.records(s["session_id"])
    assistant = records[1]["request"]["messages"][2]
    assert assistant["reasoning"] == "Look first."
    assert assistant["tool_calls"][0]["function"]["arguments"] == COMPACT
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact"]
