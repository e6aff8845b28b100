"""The Responses dialect through the recorder, over real HTTP to the reference engine (and the OpenAI SDK)."""

from __future__ import annotations

import httpx
import openai
import pytest

from openenv_harness.recorder import RecorderClient, RecorderServer
from openenv_harness.testing.engine import EngineServer, Fault, Script, ToolCallSpec, Turn

from dialect_clients import RESPONSES_TOOLS, ResponsesAgent, responses_final

COMPACT = '{"cmd":"ls -la"}'  # as sampled; the engine's parser returns '{"cmd": "ls -la"}'


@pytest.fixture
def engine():
    """Verbatim tool arguments (vLLM's ``parsed`` re-serializes them): what these tests check is that the
    sampled argument text the dialect restores reaches the template unchanged, so the chain is exact."""
    from openenv_harness.testing.engine import EngineConfig

    with EngineServer(EngineConfig(tool_arguments="verbatim")) as e:
        yield e


def _session(engine: EngineServer, admin: RecorderClient, script: Script, **spec) -> tuple[dict, str]:
    s = admin.create_session(**spec)
    engine.set_script(s["session_id"], script)
    return s, f"{admin.base_url}/rollout/{s['session_id']}/v1"


def _two_turns(reasoning: str | None = "Look first.") -> Script:
    return Script(turns=[Turn(reasoning=reasoning, tool_calls=[ToolCallSpec(name="exec_command", arguments=COMPACT)]),
                         Turn(content="Fixed.")])


@pytest.mark.parametrize("stream", [True, False])
def test_tool_episode_is_recorded_exactly_and_chains(stream: bool, engine: EngineServer, recorder: RecorderServer,
                                                     admin: RecorderClient) -> None:
    s, base = _session(engine, admin, _two_turns())
    first, last = ResponsesAgent(base, s["secret"], stream=stream).run()
    reasoning, call = first["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [{"type": "reasoning_text", "text": "Look first."}]
    assert reasoning["encrypted_content"]
    assert call["type"] == "function_call" and call["name"] == "exec_command"
    assert call["arguments"] == COMPACT  # the sampled text, not the parser's re-serialization
    assert first["status"] == last["status"] == "completed"
    assert last["output"][0]["content"][0]["text"] == "Fixed."
    records = admin.records(s["session_id"])
    sampled = [r["sampled"] for r in engine.requests(s["session_id"])]
    assert [r["prompt_token_ids"] for r in records] == [x["prompt_token_ids"] for x in sampled]
    assert [r["completion_token_ids"] for r in records] == [x["token_ids"] for x in sampled]
    assert [r["metadata"]["dialect"] for r in records] == ["responses"] * 2
    assert records[0]["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == \
        '{"cmd": "ls -la"}'  # the record keeps the engine's reply as it came
    chat = records[1]["request"]
    assert chat["messages"][0] == {"role": "system", "content": "You are Codex."}  # developer -> system
    assert chat["messages"][2]["reasoning"] == "Look first."
    assert chat["messages"][2]["tool_calls"][0]["function"]["arguments"] == COMPACT
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": call["call_id"], "content": "ok"}
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact"]
    assert first["usage"]["input_tokens"] == len(records[0]["prompt_token_ids"])
    assert first["usage"]["output_tokens"] == len(records[0]["completion_token_ids"])


def test_reserialized_arguments_and_reasoning_kept_only_as_a_handle_are_restored(
        engine: EngineServer, recorder: RecorderServer, admin: RecorderClient) -> None:
    s, base = _session(engine, admin, _two_turns())
    agent = ResponsesAgent(base, s["secret"], stream=False)
    first = agent.call()
    reasoning, call = first["output"]
    agent.body["input"] += [{**reasoning, "content": []}, {**call, "arguments": '{"cmd": "ls -la"}'},
                            {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}]
    agent.call()
    records = admin.records(s["session_id"])
    assistant = records[1]["request"]["messages"][2]
    assert assistant["reasoning"] == "Look first." and assistant["tool_calls"][0]["function"]["arguments"] == COMPACT
    assert records[1]["metadata"]["fidelity"]["class"] == "exact"


def test_the_openai_sdk_reads_replies_and_streams(engine: EngineServer, recorder: RecorderServer,
                                                  admin: RecorderClient) -> None:
    s, base = _session(engine, admin, _two_turns(reasoning=None))
    client = openai.OpenAI(base_url=base, api_key=s["secret"], max_retries=0)
    items = [{"role": "user", "content": "Fix the bug."}]
    first = client.responses.create(model="m", input=items, tools=RESPONSES_TOOLS)
    assert first.output[0].type == "function_call" and first.output[0].arguments == COMPACT
    items += [first.output[0].model_dump(exclude_none=True),
              {"type": "function_call_output", "call_id": first.output[0].call_id, "output": "done"}]
    with client.responses.stream(model="m", input=items, tools=RESPONSES_TOOLS) as stream:
        final = stream.get_final_response()
    assert final.output_text == "Fixed." and final.status == "completed"
    assert [r["metadata"]["fidelity"]["class"] for r in admin.records(s["session_id"])] == ["root", "exact"]


def test_length_is_an_incomplete_response_and_hosted_tools_are_left_out(
        engine: EngineServer, recorder: RecorderServer, admin: RecorderClient) -> None:
    s, base = _session(engine, admin, Script(turns=[Turn(content="A long answer", finish_reason="length")]))
    body = {"model": "m", "instructions": "Be brief.", "input": "hi", "max_output_tokens": 64, "stream": True,
            "tools": [*RESPONSES_TOOLS, {"type": "web_search"}, {"type": "namespace", "name": "x", "tools": []}]}
    r = httpx.post(base + "/responses", json=body, headers={"authorization": f"Bearer {s['secret']}"})
    final, events = responses_final(r.content)
    assert events[-1][0] == "response.incomplete"
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    chat = admin.records(s["session_id"])[0]["request"]
    assert chat["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert [t["function"]["name"] for t in chat["tools"]] == ["exec_command"] and chat["max_tokens"] == 64


def test_errors_keep_status_and_retry_after(engine: EngineServer, recorder: RecorderServer,
                                            admin: RecorderClient) -> None:
    s, base = _session(engine, admin, _two_turns(), budgets={"max_agent_calls": 1})
    engine.add_fault(s["session_id"], Fault(status=503, message="overloaded", retry_after=3, count=1))
    agent = ResponsesAgent(base, s["secret"])
    r = httpx.post(agent.url, json={**agent.body, "stream": True}, headers=agent.headers)
    assert r.status_code == 503 and r.headers["retry-after"] == "3"
    assert r.json()["error"]["message"] == "engine: overloaded" and r.json()["error"]["type"] == "server_error"
    agent.call()
    r = httpx.post(agent.url, json={**agent.body, "stream": True}, headers=agent.headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == "budget_exhausted"
    assert [x["metadata"]["status"] for x in admin.records(s["session_id"])] == ["failed", "ok"]
