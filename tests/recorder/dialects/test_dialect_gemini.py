"""Google's generateContent dialect through the recorder, over real HTTP to the reference engine."""

from __future__ import annotations

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderServer
from openenv_harness.testing.engine import EngineServer, Fault, Script, ToolCallSpec, Turn, reference_tokenizer

from dialect_clients import GEMINI_TOOLS, GeminiAgent

SPACED = '{"command":  "ls -la"}'  # as sampled; the engine's parser returns it re-serialized (one space)


@pytest.fixture
def engine():
    """Verbatim tool arguments: the sampled argument text the dialect restores reaches the template
    unchanged, so the chain is exact."""
    from openenv_harness.testing.engine import EngineConfig

    with EngineServer(EngineConfig(tool_arguments="verbatim")) as e:
        yield e


def _session(engine: EngineServer, admin: RecorderClient, script: Script, **spec) -> tuple[dict, str]:
    s = admin.create_session(**spec)
    engine.set_script(s["session_id"], script)
    return s, f"{admin.base_url}/rollout/{s['session_id']}"


def _two_turns(reasoning: str | None = "Look first.") -> Script:
    return Script(turns=[Turn(reasoning=reasoning, tool_calls=[ToolCallSpec(name="run_shell_command",
                                                                            arguments=SPACED)]),
                         Turn(content="Fixed.")])


@pytest.mark.parametrize("mode", ["full_history", "incremental"])
@pytest.mark.parametrize("stream", [True, False])
def test_tool_episode_is_recorded_exactly_and_chains(stream: bool, mode: str, engine: EngineServer,
                                                     recorder: RecorderServer, admin: RecorderClient) -> None:
    s, base = _session(engine, admin, _two_turns(), prompt_mode=mode)
    first, last = GeminiAgent(base, s["secret"], stream=stream).run()
    thought, call = first["candidates"][0]["content"]["parts"]
    assert thought["thought"] is True and thought["text"] == "Look first." and thought["thoughtSignature"]
    assert call["functionCall"]["name"] == "run_shell_command" and call["functionCall"]["args"] == {"command": "ls -la"}
    assert call["functionCall"]["id"]
    assert first["candidates"][0]["finishReason"] == "STOP" and last["candidates"][0]["finishReason"] == "STOP"
    assert last["candidates"][0]["content"] == {"role": "model", "parts": [{"text": "Fixed."}]}
    records = admin.records(s["session_id"])
    sampled = [e["sampled"] for e in engine.requests(s["session_id"]) if "sampled" in e]
    assert len(sampled) == 2
    assert [r["prompt_token_ids"] for r in records] == [x["prompt_token_ids"] for x in sampled]
    assert [r["completion_token_ids"] for r in records] == [x["token_ids"] for x in sampled]
    assert [r["per_token_logps"] for r in records] == [x["logprobs"] for x in sampled]
    assert [r["metadata"]["dialect"] for r in records] == ["gemini"] * 2
    assert [r["metadata"]["stream"] for r in records] == [stream] * 2
    chat = records[1]["request"]
    assert chat["model"] == "policy"
    assert chat["messages"][0] == {"role": "system", "content": "You are Gemini CLI."}
    assistant = chat["messages"][2]
    assert assistant["reasoning"] == "Look first."
    assert assistant["tool_calls"][0]["function"]["arguments"] == SPACED  # restored, though replayed as an object
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": call["functionCall"]["id"],
                                   "content": '{"output": "ok"}'}
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact"]
    assert [r["metadata"].get("prompt_mode", {}).get("continued", False) for r in records] == [False, mode == "incremental"]
    usage = first["usageMetadata"]
    assert usage["promptTokenCount"] == len(records[0]["prompt_token_ids"])
    assert usage["candidatesTokenCount"] == len(records[0]["completion_token_ids"])


def test_recorded_prompt_is_the_engines_tokenization_of_the_chat_body(engine: EngineServer, recorder: RecorderServer,
                                                                      admin: RecorderClient) -> None:
    s, base = _session(engine, admin, Script(turns=[Turn(content="hello")]))
    agent = GeminiAgent(base, s["secret"], stream=False)
    agent.body = {"contents": [{"role": "user", "parts": [{"text": "foo"}]}]}
    agent.call()
    record = admin.records(s["session_id"])[0]
    tok = reference_tokenizer()
    assert record["prompt_token_ids"] == tok.encode("<|im_start|>user\nfoo<|im_end|>\n<|im_start|>assistant\n")
    assert record["request"]["messages"] == [{"role": "user", "content": "foo"}]


def test_history_without_call_ids_pairs_responses_by_position(engine: EngineServer, recorder: RecorderServer,
                                                              admin: RecorderClient) -> None:
    s, base = _session(engine, admin, Script(turns=[Turn(content="ok")]))
    agent = GeminiAgent(base, s["secret"], stream=False)
    agent.body["contents"] += [
        {"role": "model", "parts": [{"functionCall": {"name": "run_shell_command", "args": {"command": "ls"}}},
                                    {"functionCall": {"name": "run_shell_command", "args": {"command": "pwd"}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "run_shell_command", "response": {"output": "a"}}},
                                   {"functionResponse": {"name": "run_shell_command", "response": {"output": "b"}}}]}]
    agent.call()
    messages = admin.records(s["session_id"])[0]["request"]["messages"]
    calls = messages[2]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == ['{"command": "ls"}', '{"command": "pwd"}']
    assert [m["tool_call_id"] for m in messages[3:5]] == [c["id"] for c in calls]
    assert [m["content"] for m in messages[3:5]] == ['{"output": "a"}', '{"output": "b"}']


def test_openapi_schemas_tool_config_and_generation_config(engine: EngineServer, recorder: RecorderServer,
                                                           admin: RecorderClient) -> None:
    s, base = _session(engine, admin, Script(turns=[Turn(content="A long answer", finish_reason="length")]))
    agent = GeminiAgent(base, s["secret"], stream=False)
    agent.body["tools"] = [{"functionDeclarations": [{"name": "grep", "parameters": {
        "type": "OBJECT", "properties": {"pattern": {"type": "STRING"}, "paths": {"type": "ARRAY",
                                                                                 "items": {"type": "STRING"}}}}}]}]
    agent.body["toolConfig"] = {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["grep"]}}
    agent.body["generationConfig"] = {"temperature": 0.5, "topP": 0.9, "topK": 20, "maxOutputTokens": 64,
                                      "stopSequences": ["END"], "seed": 3}
    reply = agent.call()
    assert reply["candidates"][0]["finishReason"] == "MAX_TOKENS"
    chat = admin.records(s["session_id"])[0]["request"]
    assert chat["tools"][0]["function"]["parameters"] == {
        "type": "object", "properties": {"pattern": {"type": "string"},
                                         "paths": {"type": "array", "items": {"type": "string"}}}}
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "grep"}}
    assert (chat["temperature"], chat["top_p"], chat["top_k"], chat["max_tokens"], chat["stop"], chat["seed"]) == (
        0.5, 0.9, 20, 64, ["END"], 3)


def test_count_tokens_is_the_prompt_length_and_is_never_recorded(engine: EngineServer, recorder: RecorderServer,
                                                                 admin: RecorderClient) -> None:
    s, base = _session(engine, admin, _two_turns())
    agent = GeminiAgent(base, s["secret"], stream=False)
    count_body = {k: v for k, v in agent.body.items() if k != "generationConfig"}
    counted = httpx.post(f"{base}/v1beta/models/policy:countTokens", json=count_body,
                         headers={"x-goog-api-key": s["secret"]})
    assert counted.status_code == 200, counted.text
    assert admin.records(s["session_id"]) == [] and admin.session(s["session_id"])["calls"] == 0
    agent.call()
    record = admin.records(s["session_id"])[0]
    assert counted.json() == {"totalTokens": len(record["prompt_token_ids"])}
    bad = httpx.post(f"{base}/v1beta/models/policy:countTokens", json={"contents": []},
                     headers={"x-goog-api-key": s["secret"]})
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"
    unknown = httpx.post(f"{base}/v1beta/models/policy:embedContent", json={},
                         headers={"x-goog-api-key": s["secret"]})
    assert unknown.status_code == 404 and unknown.json()["error"]["status"] == "NOT_FOUND"
    assert len(admin.records(s["session_id"])) == 1


def test_bare_route_finds_the_session_from_the_key_and_a_model_with_slashes(
        engine: EngineServer, recorder: RecorderServer, admin: RecorderClient) -> None:
    s, _ = _session(engine, admin, Script(turns=[Turn(content="hi")]))
    agent = GeminiAgent(recorder.url, s["secret"], stream=True, model="Qwen/Qwen2.5-Coder-0.5B-Instruct")
    agent.call()
    record = admin.records(s["session_id"])[0]
    assert record["request"]["model"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    denied = httpx.post(agent.url, json=agent.body, headers={"x-goog-api-key": "nope"})
    assert denied.status_code == 401
    assert denied.json() == {"error": {"code": 401, "message": denied.json()["error"]["message"],
                                       "status": "UNAUTHENTICATED"}}


def test_errors_keep_status_and_retry_after_in_googles_shape(engine: EngineServer, recorder: RecorderServer,
                                                             admin: RecorderClient) -> None:
    s, base = _session(engine, admin, _two_turns(), budgets={"max_agent_calls": 1})
    engine.add_fault(s["session_id"], Fault(status=429, message="slow down", retry_after=7, count=1))
    agent = GeminiAgent(base, s["secret"], stream=True)
    r = httpx.post(agent.url, json=agent.body, headers=agent.headers)
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert r.json() == {"error": {"code": 429, "message": "engine: slow down", "status": "RESOURCE_EXHAUSTED"}}
    agent.call()  # the retry succeeds
    agent.body["contents"].append({"role": "user", "parts": [{"text": "more"}]})
    r = httpx.post(agent.url, json=agent.body, headers=agent.headers)
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert "budget" in r.json()["error"]["message"]
    admin.close_session(s["session_id"])
    r = httpx.post(agent.url, json=agent.body, headers=agent.headers)
    assert r.status_code == 409 and r.json()["error"]["status"] == "ABORTED"


def test_retried_call_is_answered_from_the_record(engine: EngineServer, recorder: RecorderServer,
                                                  admin: RecorderClient) -> None:
    s, base = _session(engine, admin, _two_turns())
    agent = GeminiAgent(base, s["secret"], stream=True)
    first, again = agent.call(), agent.call()  # byte-identical bodies: a retry
    assert first == again
    assert len(admin.records(s["session_id"])) == 1 and len(engine.requests(s["session_id"])) == 1


def test_tools_list_is_what_the_model_saw() -> None:
    from openenv_harness.recorder.dialects.gemini_request import to_chat
    from openenv_harness.recorder.dialects.memory import ReplayMemory

    chat, call = to_chat({"contents": [{"parts": [{"text": "hi"}]}], "tools": GEMINI_TOOLS}, ReplayMemory(),
                         model="m", stream=True)
    assert chat["tools"][0]["function"]["name"] == "run_shell_command" and chat["tool_choice"] == "auto"
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True} and call.model == "m"
