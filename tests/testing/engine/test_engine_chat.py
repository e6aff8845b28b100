"""``POST /v1/chat/completions`` over real HTTP: vLLM's non-streamed reply and its token evidence."""

from __future__ import annotations

import httpx

from openenv_harness.testing.engine import EngineConfig, EngineServer, Script, ToolCallSpec, Turn, agent_echo
from openenv_harness.testing.engine.tokenizer import is_noncanonical, reference_tokenizer

TOOL_TURN = Turn(reasoning="List first.", tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls"})])
FINAL_TURN = Turn(content="I see a.txt.")


def test_reply_has_vllm_fields_and_token_evidence(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[TOOL_TURN, FINAL_TURN]))
    reply = wire.post_chat(engine, wire.chat_body([wire.SYSTEM, wire.USER]))
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    body = reply.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "service_tier", "system_fingerprint",
                         "usage", "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params",
                         "ec_transfer_params", "metrics"}
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == "reference-model" and body["prompt_logprobs"] is None
    assert body["system_fingerprint"].startswith("vllm-0.32.0+reference-") and body["prompt_text"] is None
    assert body["usage"]["prompt_tokens_details"] is None and body["usage"]["completion_tokens_details"] is None
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["stop_reason"] is None
    assert choice["routed_experts"] is None
    message = choice["message"]
    assert (message["refusal"], message["annotations"], message["audio"], message["function_call"]) == (None,) * 4
    assert message["role"] == "assistant" and message["content"] is None
    assert message["reasoning"] == "List first."
    call = message["tool_calls"][0]
    assert call["id"].startswith("chatcmpl-tool-") and call["type"] == "function"
    assert call["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
    tok = reference_tokenizer()
    ids = choice["token_ids"]
    assert ids[-1] == tok.im_end_id
    assert tok.decode(ids) == '<think>\nList first.\n</think>\n\n<tool_call>\n{"name": "bash", "arguments": ' \
                              '{"command": "ls"}}\n</tool_call><|im_end|>'
    content = choice["logprobs"]["content"]
    assert len(content) == len(ids)
    assert [c["token"] for c in content] == [tok.token_texts[i] for i in ids]
    assert all(c["top_logprobs"] == [] and -4 <= c["logprob"] < 0 for c in content)
    assert content[0]["bytes"] == list(b"<think>")
    assert body["usage"]["prompt_tokens"] == len(body["prompt_token_ids"])
    assert body["usage"]["completion_tokens"] == len(ids)
    assert body["usage"]["total_tokens"] == len(ids) + len(body["prompt_token_ids"])


def test_prompt_ids_equal_tokenize_for_the_same_messages(engine: EngineServer, wire) -> None:
    messages = [wire.SYSTEM, wire.USER]
    chat = wire.post_chat(engine, wire.chat_body(messages)).json()
    tokenized = httpx.post(engine.url + "/tokenize", json={"model": "reference-model", "messages": messages,
                                                           "tools": wire.TOOLS, "add_generation_prompt": True}).json()
    assert tokenized["tokens"] == chat["prompt_token_ids"]
    assert tokenized["count"] == len(chat["prompt_token_ids"]) and tokenized["max_model_len"] == 32768
    prompt = httpx.post(engine.url + "/tokenize", json={"prompt": "hello world"}).json()
    assert prompt["tokens"] == reference_tokenizer().encode("hello world")
    text = httpx.post(engine.url + "/detokenize", json={"tokens": chat["prompt_token_ids"]}).json()["prompt"]
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")


def test_exact_echo_extends_the_prompt_token_for_token(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[TOOL_TURN, FINAL_TURN]))
    messages = [wire.SYSTEM, wire.USER]
    first = wire.post_chat(engine, wire.chat_body(messages)).json()
    for style in ("opencode", "pi"):
        echoed = messages + [agent_echo(first["choices"][0]["message"], style),
                             {"role": "tool", "tool_call_id": "c", "content": "a.txt\n"}]
        second = wire.post_chat(engine, wire.chat_body(echoed)).json()
        held = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
        assert second["prompt_token_ids"][: len(held)] == held, style
        assert second["choices"][0]["message"]["content"] == "I see a.txt."
        assert second["choices"][0]["finish_reason"] == "stop"


def test_raw_arguments_with_spaces_drift_after_an_agent_echo(engine: EngineServer, wire) -> None:
    raw_turn = Turn(tool_calls=[ToolCallSpec(name="bash", arguments='{"command": "ls",  "timeout": 5}')])
    engine.set_script("*", Script(turns=[raw_turn, FINAL_TURN]))
    messages = [wire.SYSTEM, wire.USER]
    first = wire.post_chat(engine, wire.chat_body(messages)).json()
    message = first["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["arguments"] == '{"command": "ls", "timeout": 5}'
    echoed = messages + [agent_echo(message, "opencode"), {"role": "tool", "tool_call_id": "c", "content": "x"}]
    second = wire.post_chat(engine, wire.chat_body(echoed)).json()
    held = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert second["prompt_token_ids"][: len(first["prompt_token_ids"])] == first["prompt_token_ids"]
    assert second["prompt_token_ids"][: len(held)] != held


def test_noncanonical_completion_is_not_a_prefix_of_the_next_prompt(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[Turn(content="I will run the command now."), FINAL_TURN],
                                  segmentation="noncanonical"))
    messages = [wire.USER]
    first = wire.post_chat(engine, wire.chat_body(messages)).json()
    ids = first["choices"][0]["token_ids"]
    assert is_noncanonical(reference_tokenizer(), ids)
    echoed = messages + [agent_echo(first["choices"][0]["message"]), {"role": "user", "content": "and?"}]
    second = wire.post_chat(engine, wire.chat_body(echoed)).json()
    text_held = reference_tokenizer().decode(first["prompt_token_ids"] + ids)
    assert reference_tokenizer().decode(second["prompt_token_ids"]).startswith(text_held)
    assert second["prompt_token_ids"][: len(first["prompt_token_ids"]) + len(ids)] != first["prompt_token_ids"] + ids


def test_scripts_are_found_by_session_header_then_model_then_default(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[Turn(content="default")]))
    engine.set_script("lora-v2", Script(turns=[Turn(content="by model")]))
    engine.set_script("sess-1", Script(turns=[Turn(content="by session")]))

    def content(model: str, session: str | None) -> str:
        headers = {"X-OpenEnv-Harness-Session": session} if session else None
        reply = wire.post_chat(engine, wire.chat_body([wire.USER], model=model), headers=headers).json()
        assert reply["model"] == model
        return reply["choices"][0]["message"]["content"]

    assert content("reference-model", None) == "default"
    assert content("lora-v2", None) == "by model"
    assert content("lora-v2", "sess-1") == "by session"
    assert content("reference-model", "unknown-session") == "default"
    logged = engine.requests("sess-1")
    assert len(logged) == 1 and logged[0]["headers"]["x-openenv-harness-session"] == "sess-1"
    assert logged[0]["body"]["model"] == "lora-v2" and logged[0]["turn_index"] == 0
    assert len(engine.requests("lora-v2")) == 2 and len(engine.requests()) == 4


def test_aux_calls_get_a_short_answer_and_do_not_consume_turns(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[FINAL_TURN]))
    aux = wire.post_chat(engine, {"messages": [{"role": "user", "content": "Title please"}], "max_tokens": 32})
    assert aux.json()["choices"][0]["message"]["content"] == "Tool run summary"
    agent = wire.post_chat(engine, wire.chat_body([wire.USER])).json()
    assert agent["choices"][0]["message"]["content"] == "I see a.txt."


def test_max_tokens_truncates_with_finish_length(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[Turn(content="A long answer with many words in it.")]))
    reply = wire.post_chat(engine, wire.chat_body([wire.USER], max_completion_tokens=4)).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 4
    assert reference_tokenizer().im_end_id not in choice["token_ids"]
    assert choice["message"]["content"] == reference_tokenizer().decode(choice["token_ids"])


def test_top_logprobs_list_the_sampled_token_first(engine: EngineServer, wire) -> None:
    reply = wire.post_chat(engine, wire.chat_body([wire.USER], top_logprobs=3)).json()
    for entry in reply["choices"][0]["logprobs"]["content"]:
        top = entry["top_logprobs"]
        assert len(top) == 3 and top[0]["token"] == entry["token"] and top[0]["logprob"] == entry["logprob"]
        assert all(t["logprob"] <= entry["logprob"] for t in top[1:])
        assert len({t["token"] for t in top}) == 3


def test_without_the_extra_fields_the_reply_is_plain_openai(engine: EngineServer, wire) -> None:
    body = {"messages": [wire.USER], "tools": wire.TOOLS}
    reply = wire.post_chat(engine, body).json()
    assert reply["prompt_token_ids"] is None and reply["choices"][0]["token_ids"] is None
    assert reply["choices"][0]["logprobs"] is None
    assert reply["choices"][0]["message"]["content"] == "Done."


def test_bad_requests_get_vllm_error_bodies(engine: EngineServer, wire) -> None:
    bad_json = httpx.post(engine.url + "/v1/chat/completions", content=b"{nope",
                          headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and bad_json.json()["error"]["type"] == "BadRequestError"
    missing = wire.post_chat(engine, {"model": "reference-model"})
    assert missing.status_code == 400 and "messages" in missing.json()["error"]["message"]
    two = wire.post_chat(engine, wire.chat_body([wire.USER], n=2))
    assert two.status_code == 400 and two.json()["error"] == {
        "message": two.json()["error"]["message"], "type": "BadRequestError", "param": "n", "code": 400}
    role = wire.post_chat(engine, wire.chat_body([{"role": "robot", "content": "x"}]))
    assert role.status_code == 400 and "Unsupported message role" in role.json()["error"]["message"]
    too_long = wire.post_chat(engine, wire.chat_body([wire.USER], max_tokens=10**6))
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "max_tokens"
    extra_fields = wire.post_chat(engine, wire.chat_body([wire.USER], store=False, cache_salt="x", seed=3))
    assert extra_fields.status_code == 200


def test_engine_options_reasoning_field_token_ids_strict_model_and_parsed_arguments(wire) -> None:
    config = EngineConfig(reasoning_field="reasoning_content", return_tokens_as_token_ids=True,
                          strict_model_name=True, tool_arguments="parsed",
                          default_script=Script(turns=[TOOL_TURN, FINAL_TURN], arguments_format="spaced"))
    with EngineServer(config) as engine:
        first = wire.post_chat(engine, wire.chat_body([wire.USER])).json()
        message = first["choices"][0]["message"]
        assert message["reasoning_content"] == "List first." and "reasoning" not in message
        ids = first["choices"][0]["token_ids"]
        assert [c["token"] for c in first["choices"][0]["logprobs"]["content"]] == [f"token_id:{i}" for i in ids]
        unknown = wire.post_chat(engine, wire.chat_body([wire.USER], model="nope"))
        assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "NotFoundError"
        # parsed arguments + spaced sampling: a compacting agent still replays the exact text
        echoed = [wire.USER, agent_echo(message, "pi"), {"role": "tool", "tool_call_id": "c", "content": "x"}]
        second = wire.post_chat(engine, wire.chat_body(echoed)).json()
        held = first["prompt_token_ids"] + ids
        assert second["prompt_token_ids"][: len(held)] == held


def test_generation_config_defaults_fill_in_absent_sampling_fields(wire) -> None:
    from openenv_harness.testing.engine import GenerationConfig

    generation = GenerationConfig(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05, max_new_tokens=3)
    with EngineServer(EngineConfig(generation_config=generation)) as engine:
        engine.set_script("*", Script(turns=[Turn(content="A long answer with many words in it.")]))
        defaulted = wire.post_chat(engine, wire.chat_body([wire.USER])).json()
        pinned = wire.post_chat(engine, wire.chat_body([wire.USER], temperature=0, max_tokens=6)).json()
        first, second = (r["sampling"] for r in engine.requests())
    assert (first["temperature"], first["top_p"], first["top_k"], first["repetition_penalty"]) == (0.7, 0.8, 20, 1.05)
    assert (first["max_tokens"], len(defaulted["choices"][0]["token_ids"])) == (3, 3)  # max_new_tokens
    assert (second["temperature"], second["top_p"], second["max_tokens"]) == (0, 0.8, 6)
    assert len(pinned["choices"][0]["token_ids"]) == 6
    with EngineServer() as plain:  # off by default: vLLM's neutral values (--generation-config vllm)
        wire.post_chat(plain, wire.chat_body([wire.USER]))
        neutral = plain.requests()[-1]["sampling"]
    assert (neutral["temperature"], neutral["top_p"], neutral["top_k"]) == (1.0, 1.0, 0)


def test_length_rules_of_vllm_0_32(engine: EngineServer, wire) -> None:
    over = wire.post_chat(engine, wire.chat_body([wire.USER], max_tokens=32769))
    assert over.status_code == 400 and over.json()["error"]["param"] == "max_tokens"
    assert "cannot be greater than max_model_len=32768" in over.json()["error"]["message"]
    # within max_model_len but past what the prompt leaves: accepted, the budget clamped
    assert wire.post_chat(engine, wire.chat_body([wire.USER], max_tokens=32768)).status_code == 200
    huge = wire.post_chat(engine, wire.chat_body([{"role": "user", "content": "word " * 40000}]))
    assert huge.status_code == 400 and huge.json()["error"]["param"] == "input_tokens"


def test_stream_options_need_a_stream_and_required_tool_choice_says_content_empty(engine: EngineServer, wire) -> None:
    options = wire.post_chat(engine, wire.chat_body([wire.USER], stream_options={"include_usage": True}))
    assert options.status_code == 400 and options.json()["error"]["param"] == "stream_options"
    engine.set_script("*", Script(turns=[TOOL_TURN]))
    auto = wire.post_chat(engine, wire.chat_body([wire.USER])).json()["choices"][0]["message"]
    required = wire.post_chat(engine, wire.chat_body([wire.USER], tool_choice="required")).json()["choices"][0]
    assert auto["content"] is None and required["message"]["content"] == ""
    assert required["finish_reason"] == "tool_calls" and required["message"]["tool_calls"]


def test_prompt_text_and_no_reasoning_parser(wire) -> None:
    config = EngineConfig(reasoning_parser=None, default_script=Script(turns=[TOOL_TURN]))
    with EngineServer(config) as engine:
        reply = wire.post_chat(engine, wire.chat_body([wire.USER], return_prompt_text=True)).json()
        assert reply["prompt_text"] == reference_tokenizer().decode(reply["prompt_token_ids"])
        message = reply["choices"][0]["message"]
        assert message["reasoning"] is None and message["content"].startswith("<think>\nList first.\n</think>")
        assert message["tool_calls"][0]["function"]["name"] == "bash"
