"""The reference engine's render / generate / derender routes and id-prompt completions."""

from __future__ import annotations

from typing import Any

import httpx

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
    assert d["choices"][0]["finish_reason"] == "tool_calls"
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
    from pathlib import Path

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
