"""The reference engine's render / generate / derender routes and id-prompt completions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from openenv_harness.testing.engine import EngineConfig, EngineServer

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "logprobs": True,
                        "top_logprobs": 0}
SCRIPT = {"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}]}
SESSION = {"x-openenv-harness-session": "s1"}


def test_generate_from_rendered_ids_samples_what_chat_samples_and_derender_parses_it(engine: EngineServer) -> None:
    with httpx.Client(base_url=engine.url) as c:
        c.post("/_ref/scripts", json={"key": "s1", "script": SCRIPT}).raise_for_status()
        r = c.post("/v1/chat/completions/render", json=CHAT).json()
        g = c.post("/inference/v1/generate", headers=SESSION,
                   json={"token_ids": r["token_ids"], "sampling_params": r["sampling_params"]}).json()
        d = c.post("/v1/chat/completions/derender",
                   json={"generate_response": g, "prompt_token_ids": r["token_ids"], "chat_request": CHAT}).json()
        chat = c.post("/v1/chat/completions", headers=SESSION, json={**CHAT, "return_token_ids": True}).json()
    assert r["token_ids"] == chat["prompt_token_ids"]
    assert g["choices"][0]["token_ids"] == chat["choices"][0]["token_ids"]
    assert [e["logprob"] for e in g["choices"][0]["logprobs"]["content"]] == \
        [e["logprob"] for e in chat["choices"][0]["logprobs"]["content"]]
    message = d["choices"][0]["message"]
    # vLLM 0.32's derender passes generate's finish reason on; its chat route says "tool_calls"
    assert d["choices"][0]["finish_reason"] == g["choices"][0]["finish_reason"] == "stop"
    assert chat["choices"][0]["finish_reason"] == "tool_calls"
    assert [c["function"] for c in message["tool_calls"]] == [c["function"] for c in chat["choices"][0]["message"]["tool_calls"]]


def test_id_prompt_completion_and_bad_generate(engine: EngineServer) -> None:
    with httpx.Client(base_url=engine.url) as c:
        r = c.post("/v1/chat/completions/render", json={"messages": [{"role": "user", "content": "hi"}]}).json()
        comp = c.post("/v1/completions", json={"prompt": r["token_ids"], "max_tokens": 50,
                                               "return_token_ids": True}).json()
        bad = c.post("/inference/v1/generate", json={"token_ids": []})
        oov = c.post("/inference/v1/generate", json={"token_ids": [10**9], "sampling_params": {}})
    assert comp["choices"][0]["prompt_token_ids"] == r["token_ids"]
    assert comp["choices"][0]["text"] == "Tool run summary"  # no tools rendered: the aux answer
    assert bad.status_code == 400 and "token_ids" in bad.json()["error"]["message"]
    assert oov.status_code == 400


def test_without_scale_out_the_routes_are_absent() -> None:
    with EngineServer(EngineConfig(scale_out=False)) as engine, httpx.Client(base_url=engine.url) as c:
        assert c.post("/v1/chat/completions/render", json=CHAT).status_code == 404
        assert c.post("/inference/v1/generate", json={"token_ids": [1], "sampling_params": {}}).status_code == 404


def test_without_the_generate_route_id_prompts_still_sample() -> None:
    with EngineServer(EngineConfig(generate_route=False)) as engine, httpx.Client(base_url=engine.url) as c:
        r = c.post("/v1/chat/completions/render", json=CHAT).json()
        assert c.post("/inference/v1/generate", json={"token_ids": []}).status_code == 404
        comp = c.post("/v1/completions", json={"prompt": r["token_ids"], "max_tokens": 50, "logprobs": 0,
                                               "return_token_ids": True, "return_tokens_as_token_ids": True}).json()
        assert c.post("/v1/chat/completions/derender", json={
            "generate_response": {"choices": [{"index": 0, "token_ids": comp["choices"][0]["token_ids"]}]},
            "prompt_token_ids": r["token_ids"], "chat_request": CHAT}).status_code == 200
    choice = comp["choices"][0]
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert [list(top) for top in choice["logprobs"]["top_logprobs"]] == [[f"token_id:{t}"] for t in choice["token_ids"]]


def test_generate_picks_the_chat_routes_turn_under_a_template_that_renders_tool_results_as_user() -> None:
    """Qwen3's templates render a tool result as ``<|im_start|>user\\n<tool_response>``: still a tool turn."""

    import trl

    template = Path(trl.__file__).parent / "chat_templates" / "qwen3_training.jinja"
    two = {"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}, {"content": "Done."}]}
    chat = {**CHAT, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"}]}
    with EngineServer(EngineConfig(chat_template=template)) as engine, httpx.Client(base_url=engine.url) as c:
        c.post("/_ref/scripts", json={"key": "s1", "script": two}).raise_for_status()
        r = c.post("/v1/chat/completions/render", json=chat).json()
        assert "<tool_response>" in c.post("/detokenize", json={"tokens": r["token_ids"]}).json()["prompt"]
        g = c.post("/inference/v1/generate", headers=SESSION,
                   json={"token_ids": r["token_ids"], "sampling_params": r["sampling_params"]}).json()
        d = c.post("/v1/chat/completions/derender",
                   json={"generate_response": g, "prompt_token_ids": r["token_ids"], "chat_request": chat}).json()
    assert d["choices"][0]["message"]["content"] == "Done."  # the second turn, as the chat route would pick


def test_the_lean_routes_answer_errors_other_methods_and_closing_connections_like_fastapi(engine: EngineServer) -> None:
    """The scale-out routes skip FastAPI's machinery (``app.EngineApp.lean_routes``): its answers stay."""
    with httpx.Client(base_url=engine.url) as c:
        assert c.get("/v1/chat/completions/render").status_code == 405  # other methods: FastAPI's 405
        bad = c.post("/inference/v1/generate", content=b"{not json")
        assert bad.status_code == 400 and "Invalid JSON body" in bad.json()["error"]["message"]
        broken = c.post("/v1/chat/completions/derender", json={
            "generate_response": {"choices": [{"token_ids": ["x"]}]}, "chat_request": CHAT})
        assert broken.status_code == 500 and broken.json()["error"]["message"].startswith("ValueError")
        for _ in range(3):  # one connection, kept alive across answers
            assert c.post("/v1/chat/completions/render", json=CHAT).status_code == 200
    closing = httpx.post(engine.url + "/v1/chat/completions/render", json=CHAT, headers={"connection": "close"})
    assert closing.status_code == 200 and closing.headers["connection"] == "close"
    assert closing.json()["token_ids"]


# --- vLLM 0.33's one-step parse (EngineConfig.generate_derender) ---------------------------------------------

#: field names of vLLM 0.33's scale-out models, read off its source (the file says where)
VLLM033 = json.loads((Path(__file__).parent / "vllm033_fields.json").read_text())
TOOL_TURN = {"reasoning": "List first.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}
TEXT_TURN = {"reasoning": "Nothing to run.", "content": "All done."}
#: a history with three tool calls made by the assistant (two in one turn) and one the user quotes
HISTORY = [
    {"role": "user", "content": "hi", "tool_calls": [{"id": "u1", "type": "function",
                                                      "function": {"name": "bash", "arguments": "{}"}}]},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}},
        {"id": "c2", "type": "function", "function": {"name": "bash", "arguments": '{"command": "pwd"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    {"role": "tool", "tool_call_id": "c2", "content": "/w"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c3", "type": "function", "function": {"name": "bash", "arguments": '{"command": "cat a.py"}'}}]},
    {"role": "tool", "tool_call_id": "c3", "content": "print(1)"}]


@pytest.fixture(scope="module")
def one_step() -> Iterator[EngineServer]:
    """An engine answering as vLLM 0.33 (``--generate-derender``)."""
    with EngineServer(EngineConfig(generate_derender=True)) as server:
        yield server


@pytest.fixture
def c033(one_step: EngineServer) -> Iterator[httpx.Client]:
    one_step.reset()
    with httpx.Client(base_url=one_step.url) as client:
        yield client


def _without_call_ids(message: dict[str, Any]) -> dict[str, Any]:
    """A parsed message without its tool calls' ids (fresh random ones on every answer)."""
    calls = [{k: v for k, v in call.items() if k != "id"} for call in message.get("tool_calls") or []]
    return {**message, **({"tool_calls": calls} if "tool_calls" in message else {})}


def _one_step_body(r: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"token_ids": r["token_ids"], "sampling_params": r["sampling_params"], "output_mode": "derender",
            "parse_context": r["parse_context"], **extra}


def test_render_answers_vllm_033s_parse_context_only_with_the_flag(c033: httpx.Client, engine: EngineServer,
                                                                     wire) -> None:
    with_history = {"messages": HISTORY, "tools": wire.TOOLS, "include_reasoning": False,
                    "parallel_tool_calls": False, "chat_template_kwargs": {"enable_thinking": False}}
    pc = c033.post("/v1/chat/completions/render", json=with_history).json()["parse_context"]
    # vLLM hands the tools on as its own model dumps them: the functions are what was sent
    assert [(t["type"], t["function"]) for t in pc.pop("tools")] == [("function", t["function"]) for t in wire.TOOLS]
    assert pc == {"tool_choice": "auto", "parallel_tool_calls": False, "include_reasoning": False,
                  "chat_template_kwargs": {"enable_thinking": False}, "history_tool_call_cnt": 3}
    plain = c033.post("/v1/chat/completions/render", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert plain["parse_context"] == {"tools": None, "tool_choice": "none", "parallel_tool_calls": True,
                                      "include_reasoning": True, "chat_template_kwargs": {},
                                      "history_tool_call_cnt": 0}
    required = c033.post("/v1/chat/completions/render", json={**CHAT, "tool_choice": "required"}).json()
    assert required["parse_context"]["tool_choice"] == "required"
    assert required["parse_context"]["history_tool_call_cnt"] == 0
    off = httpx.post(engine.url + "/v1/chat/completions/render", json=CHAT).json()  # vLLM 0.32
    assert "parse_context" not in off and off["token_ids"] == required["token_ids"]


@pytest.mark.parametrize("turn", [TOOL_TURN, TEXT_TURN], ids=["tool-call", "text"])
@pytest.mark.parametrize("top_logprobs", [0, 1])
def test_one_step_generate_answers_what_generate_then_derender_answer(c033: httpx.Client, turn: dict[str, Any],
                                                                      top_logprobs: int) -> None:
    chat = {**CHAT, "top_logprobs": top_logprobs}
    c033.post("/_ref/scripts", json={"key": "s1", "script": {"turns": [turn]}}).raise_for_status()
    r = c033.post("/v1/chat/completions/render", json=chat).json()
    g = c033.post("/inference/v1/generate", headers=SESSION,
                  json={"token_ids": r["token_ids"], "sampling_params": r["sampling_params"]}).json()
    d = c033.post("/v1/chat/completions/derender",
                  json={"generate_response": g, "prompt_token_ids": r["token_ids"], "chat_request": chat}).json()
    one = c033.post("/inference/v1/generate", headers=SESSION, json=_one_step_body(r)).json()
    coupled = c033.post("/v1/chat/completions", headers=SESSION, json=chat).json()
    choice, two = one["choices"][0], d["choices"][0]
    assert one["output_mode"] == "derender"
    assert _without_call_ids(choice["message"]) == _without_call_ids(two["message"])
    assert choice["message"]["reasoning"] == turn["reasoning"]
    assert choice["finish_reason"] == two["finish_reason"] == ("tool_calls" if "tool_calls" in turn else "stop")
    assert choice["token_ids"] == g["choices"][0]["token_ids"] and choice["token_ids"]
    assert choice["weight_versions"] == g["choices"][0]["weight_versions"]
    # chat logprobs (token text and bytes), cut to top_logprobs as the chat route cuts them
    assert choice["logprobs"] == two["logprobs"] == coupled["choices"][0]["logprobs"]
    assert all(len(e["top_logprobs"]) == top_logprobs for e in choice["logprobs"]["content"])


def test_one_step_generate_refuses_what_vllm_033_refuses(c033: httpx.Client, engine: EngineServer) -> None:
    r = c033.post("/v1/chat/completions/render", json=CHAT).json()

    def refused(client: httpx.Client, body: dict[str, Any]) -> str:
        answer = client.post("/inference/v1/generate", json=body)
        assert answer.status_code == 400, answer.text
        return answer.json()["error"]["message"]

    assert "stream=true" in refused(c033, _one_step_body(r, stream=True))
    assert "requires parse_context" in refused(c033, {**_one_step_body(r), "parse_context": None})
    assert "detokenize" in refused(c033, _one_step_body(r, sampling_params={**r["sampling_params"],
                                                                               "detokenize": False}))
    newer = {**r["parse_context"], "tool_parser_state": {}}  # a field from a newer render
    assert "tool_parser_state" in refused(c033, _one_step_body(r, parse_context=newer))
    named = {**r["parse_context"], "tool_choice": {"type": "function", "function": {"name": "read"}}}
    assert "tool_choice" in refused(c033, _one_step_body(r, parse_context=named))
    assert "history_tool_call_cnt" in refused(c033, _one_step_body(
        r, parse_context={**r["parse_context"], "history_tool_call_cnt": -1}))
    # at the tokens level parse_context is not read: a newer render's fields pass (a prefill leg's body)
    tokens = c033.post("/inference/v1/generate", json={**_one_step_body(r, parse_context=newer),
                                                        "output_mode": "tokens"})
    assert tokens.status_code == 200 and "message" not in tokens.json()["choices"][0]
    # vLLM 0.32 knows no such level: the body fails on output_mode
    off = httpx.post(engine.url + "/inference/v1/generate", json=_one_step_body(r))
    assert off.status_code == 400 and "output_mode" in off.json()["error"]["message"]


def test_include_reasoning_false_hides_the_reasoning_and_the_per_token_metadata(c033: httpx.Client) -> None:
    c033.post("/_ref/scripts", json={"key": "s1", "script": {"turns": [TOOL_TURN]}}).raise_for_status()
    r = c033.post("/v1/chat/completions/render", json={**CHAT, "include_reasoning": False}).json()
    assert r["parse_context"]["include_reasoning"] is False
    one = c033.post("/inference/v1/generate", headers=SESSION, json=_one_step_body(r)).json()
    choice = one["choices"][0]
    assert choice["logprobs"] is None and choice["token_ids"] is None and choice["sampling_mask"] is None
    assert choice["message"]["reasoning"] is None  # vLLM drops it; the call is still parsed
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["bash"]
    assert choice["finish_reason"] == "tool_calls" and one["usage"]["completion_tokens"] > 0


def test_replies_carry_exactly_vllm_033s_fields(c033: httpx.Client) -> None:
    """pydantic's model_dump writes every field (None ones too): each reply has exactly 0.33's keys."""
    c033.post("/_ref/scripts", json={"key": "s1", "script": {"turns": [TOOL_TURN]}}).raise_for_status()
    for chat in (CHAT, {**CHAT, "include_reasoning": False}):
        r = c033.post("/v1/chat/completions/render", json=chat).json()
        assert sorted(r) == sorted(VLLM033["GenerateRequest"])
        assert sorted(r["parse_context"]) == sorted(VLLM033["ParseContext"])
        one = c033.post("/inference/v1/generate", headers=SESSION, json=_one_step_body(r)).json()
        assert sorted(one) == sorted(VLLM033["GenerateDerenderResponse"])
        assert sorted(one["choices"][0]) == sorted(VLLM033["GenerateDerenderChoice"])
