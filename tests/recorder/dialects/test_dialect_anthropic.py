"""The Anthropic Messages dialect through the recorder, over real HTTP to the reference engine."""

from __future__ import annotations

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderServer
from openenv_harness.testing.engine import EngineServer, Fault, Script, ToolCallSpec, Turn, reference_tokenizer

from dialect_clients import ANTHROPIC_TOOLS, AnthropicAgent

SPACED = '{"command":  "ls -la"}'  # as sampled; the engine's parser returns it re-serialized (one space)


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
    return Script(turns=[Turn(reasoning=reasoning, tool_calls=[ToolCallSpec(name="Bash", arguments=SPACED)]),
                         Turn(content="Fixed.")])


@pytest.mark.parametrize("stream", [True, False])
def test_tool_episode_is_recorded_exactly_and_chains(stream: bool, engine: EngineServer, recorder: RecorderServer,
                                                     admin: RecorderClient) -> None:
    s, base = _session(engine, admin, _two_turns())
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1.2.3; cc_entrypoint=cli;"},
              {"type": "text", "text": "You are a coding agent."}, {"type": "text", "text": " Be brief."}]
    replies = AnthropicAgent(base, s["secret"], stream=stream, system=system).run()
    first, last = replies
    thinking, use = first["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "Look first." and thinking["signature"]
    assert use == {"type": "tool_use", "id": use["id"], "name": "Bash", "input": {"command": "ls -la"}}
    assert first["stop_reason"] == "tool_use" and last["stop_reason"] == "end_turn"
    assert last["content"] == [{"type": "text", "text": "Fixed."}]
    if stream:  # the sampled argument text itself, not the parser's re-serialization
        assert first["_partial_json"][1] == SPACED
    records = admin.records(s["session_id"])
    sampled = [r["sampled"] for r in engine.requests(s["session_id"])]
    assert [r["prompt_token_ids"] for r in records] == [x["prompt_token_ids"] for x in sampled]
    assert [r["completion_token_ids"] for r in records] == [x["token_ids"] for x in sampled]
    assert [r["metadata"]["dialect"] for r in records] == ["anthropic"] * 2
    assert [r["metadata"]["stream"] for r in records] == [stream] * 2
    # the record's request is the chat body the engine rendered: billing header gone, blocks joined
    chat = records[1]["request"]
    assert chat["messages"][0] == {"role": "system", "content": "You are a coding agent. Be brief."}
    assistant = chat["messages"][2]
    assert assistant["reasoning"] == "Look first."
    assert assistant["tool_calls"][0]["function"]["arguments"] == SPACED  # restored, though replayed as an object
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": use["id"], "content": "ok"}
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact"]
    usage = first["usage"]
    assert usage["input_tokens"] == len(records[0]["prompt_token_ids"])
    assert usage["output_tokens"] == len(records[0]["completion_token_ids"])


def test_changed_input_is_the_agents_history(engine: EngineServer, recorder: RecorderServer,
                                             admin: RecorderClient) -> None:
    s, base = _session(engine, admin, _two_turns(reasoning=None))
    agent = AnthropicAgent(base, s["secret"])
    first = agent.call()
    use = first["content"][0]
    edited = {**use, "input": {"command": "ls"}}  # the agent changed the call it replays
    agent.body["messages"] += [{"role": "assistant", "content": [edited]},
                               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                             "content": [{"type": "text", "text": "a"},
                                                                         {"type": "text", "text": "b"}]}]}]
    agent.call()
    records = admin.records(s["session_id"])
    messages = records[1]["request"]["messages"]
    assert messages[-2]["tool_calls"][0]["function"]["arguments"] == '{"command": "ls"}'  # json.dumps, as vLLM
    assert messages[-1] == {"role": "tool", "tool_call_id": use["id"], "content": "a\nb"}
    assert records[1]["metadata"]["fidelity"]["class"] != "exact"


def test_thinking_sent_back_without_its_text_is_restored_from_the_signature(
        engine: EngineServer, recorder: RecorderServer, admin: RecorderClient) -> None:
    s, base = _session(engine, admin, _two_turns())
    agent = AnthropicAgent(base, s["secret"], stream=False)
    first = agent.call()
    blocks = [{**b, "thinking": ""} if b["type"] == "thinking" else b for b in first["content"]]
    agent.body["messages"] += [{"role": "assistant", "content": blocks},
                               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": blocks[1]["id"],
                                                             "content": "ok"}]}]
    agent.call()
    records = admin.records(s["session_id"])
    assert records[1]["request"]["messages"][2]["reasoning"] == "Look first."
    assert records[1]["metadata"]["fidelity"]["class"] == "exact"


def test_length_stop_and_inline_system_messages(engine: EngineServer, recorder: RecorderServer,
                                                admin: RecorderClient) -> None:
    s, base = _session(engine, admin, Script(turns=[Turn(content="A long answer", finish_reason="length")]))
    body = {"model": "m", "max_tokens": 64, "tools": ANTHROPIC_TOOLS, "messages": [
        {"role": "user", "content": "hi"}, {"role": "system", "content": [{"type": "text", "text": "# Env"}]}]}
    r = httpx.post(base + "/messages", json=body, headers={"authorization": f"Bearer {s['secret']}"})
    assert r.status_code == 200, r.text
    assert r.json()["stop_reason"] == "max_tokens"
    chat = admin.records(s["session_id"])[0]["request"]
    assert chat["messages"] == [{"role": "user", "content": "hi"}, {"role": "system", "content": "# Env"}]
    assert chat["max_tokens"] == 64 and chat["tool_choice"] == "auto"


def test_tool_additions_and_removals_resolve_to_one_tool_list(engine: EngineServer, recorder: RecorderServer,
                                                              admin: RecorderClient) -> None:
    s, base = _session(engine, admin, Script(turns=[Turn(content="ok")]))
    deferred = {"name": "Grep", "description": "search", "input_schema": {"type": "object"}, "defer_loading": True}
    body = {"model": "m", "max_tokens": 16, "tools": [*ANTHROPIC_TOOLS, deferred], "messages": [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "Grep"}},
                                       {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "Bash"}}]}]}
    r = httpx.post(base + "/messages", json=body, headers={"x-api-key": s["secret"]})
    assert r.status_code == 200, r.text
    tools = admin.records(s["session_id"])[0]["request"]["tools"]
    assert [t["function"] for t in tools] == [{"name": "Grep", "description": "search",
                                               "parameters": {"type": "object"}}]


def test_count_tokens_is_the_prompt_length_and_is_never_recorded(engine: EngineServer, recorder: RecorderServer,
                                                                 admin: RecorderClient) -> None:
    s, base = _session(engine, admin, _two_turns())
    agent = AnthropicAgent(base, s["secret"], stream=False)
    count_body = {k: v for k, v in agent.body.items() if k != "max_tokens"}
    counted = httpx.post(base + "/messages/count_tokens", json=count_body, headers={"x-api-key": s["secret"]})
    assert counted.status_code == 200, counted.text
    before = admin.session(s["session_id"])
    assert len(admin.records(s["session_id"])) == 0 and before["calls"] == 0
    agent.call()
    record = admin.records(s["session_id"])[0]
    assert counted.json() == {"input_tokens": len(record["prompt_token_ids"])}
    bare = httpx.post(recorder.url + "/v1/messages/count_tokens", json={"model": "m", "messages": [
        {"role": "user", "content": "foo"}]}, headers={"authorization": f"Bearer {s['secret']}"})
    assert bare.status_code == 200
    tok = reference_tokenizer()
    assert bare.json()["input_tokens"] == len(tok.encode("<|im_start|>user\nfoo<|im_end|>\n<|im_start|>assistant\n"))
    assert len(admin.records(s["session_id"])) == 1 and admin.session(s["session_id"])["calls"] == 1


def test_errors_keep_status_and_retry_after_in_anthropics_shape(engine: EngineServer, recorder: RecorderServer,
                                                                admin: RecorderClient) -> None:
    s, base = _session(engine, admin, _two_turns(), budgets={"max_agent_calls": 1})
    engine.add_fault(s["session_id"], Fault(status=429, message="slow down", retry_after=7, count=1))
    agent = AnthropicAgent(base, s["secret"], stream=True)
    r = httpx.post(agent.url, json={**agent.body, "stream": True}, headers=agent.headers)
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert r.json() == {"type": "error", "error": {"type": "rate_limit_error", "message": "engine: slow down"}}
    assert "x-should-retry" not in r.headers  # the SDK retries a 429 on its own
    agent.call()  # the retry succeeds
    r = httpx.post(agent.url, json={**agent.body, "stream": True}, headers=agent.headers)
    assert r.status_code == 400 and r.headers["x-should-retry"] == "false"
    assert r.json()["error"]["type"] == "invalid_request_error" and "budget" in r.json()["error"]["message"]
    records = admin.records(s["session_id"])
    assert [r["metadata"]["status"] for r in records] == ["failed", "ok"]
    admin.close_session(s["session_id"])
    r = httpx.post(agent.url, json=agent.body, headers=agent.headers)
    assert r.status_code == 409 and r.json()["type"] == "error" and r.headers["x-should-retry"] == "false"


def test_retried_call_is_answered_from_the_record(engine: EngineServer, recorder: RecorderServer,
                                                  admin: RecorderClient) -> None:
    s, base = _session(engine, admin, _two_turns())
    agent = AnthropicAgent(base, s["secret"], stream=True)
    first, again = agent.call(), agent.call()  # byte-identical bodies: a retry
    assert first == again
    assert len(admin.records(s["session_id"])) == 1 and len(engine.requests(s["session_id"])) == 1


def test_model_list_in_anthropics_shape(engine: EngineServer, recorder: RecorderServer, admin: RecorderClient) -> None:
    s = admin.create_session()
    headers = {"x-api-key": s["secret"], "anthropic-version": "2023-06-01"}
    r = httpx.get(f"{recorder.url}/rollout/{s['session_id']}/v1/models", headers=headers)
    assert r.status_code == 200
    body = r.json()
    served = engine.info()["served_model_name"]
    assert [m["id"] for m in body["data"]] == [served] and body["data"][0]["type"] == "model"
    assert body["has_more"] is False and body["first_id"] == served
    denied = httpx.get(f"{recorder.url}/v1/models", headers={**headers, "x-api-key": "nope"})
    assert denied.status_code == 401 and denied.json()["type"] == "error"
    assert httpx.get(f"{recorder.url}/v1/models", headers={"x-api-key": s["secret"]}).json()["object"] == "list"
