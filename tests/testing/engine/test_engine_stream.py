"""Streamed replies: vLLM's chunk sequence, and deltas that add up to the non-streamed reply
(except tool arguments, which a hermes parser streams as sampled and returns re-serialized)."""

from __future__ import annotations

from typing import Any

from openenv_harness.testing.engine import EngineServer, Script, ToolCallSpec, Turn

TURN = Turn(
    reasoning="Look around first.",
    content="Let me check.",
    tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls -la"}),
                ToolCallSpec(name="read", arguments='{"path":  "notes.txt"}')],
)


def _assemble(events: list[Any]) -> dict[str, Any]:
    """Fold the deltas the way an OpenAI client does."""
    message: dict[str, Any] = {"content": "", "reasoning": "", "tool_calls": {}}
    token_ids: list[int] = []
    logprobs: list[dict] = []
    finish = None
    for event in events:
        if event == "[DONE]" or not event["choices"]:
            continue
        choice = event["choices"][0]
        delta = choice["delta"]
        message["content"] += delta.get("content") or ""
        message["reasoning"] += delta.get("reasoning") or ""
        for call in delta.get("tool_calls", []):
            slot = message["tool_calls"].setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
            slot["id"] = call.get("id", slot["id"])
            slot["name"] += call.get("function", {}).get("name", "")
            slot["arguments"] += call.get("function", {}).get("arguments", "")
        token_ids += choice.get("token_ids") or []
        logprobs += (choice.get("logprobs") or {}).get("content", [])
        finish = choice["finish_reason"] or finish
    return {"message": message, "token_ids": token_ids, "logprobs": logprobs, "finish_reason": finish}


def test_chunk_sequence(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[TURN]))
    body = wire.chat_body([wire.SYSTEM, wire.USER], stream_options={"include_usage": True})
    events = wire.read_sse(engine, body)
    first, *middle, usage, done = events
    assert done == "[DONE]"
    assert first["object"] == "chat.completion.chunk" and first["id"].startswith("chatcmpl-")
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                 "logprobs": None, "finish_reason": None}]
    assert isinstance(first["prompt_token_ids"], list) and first["prompt_token_ids"]
    assert all("prompt_token_ids" not in e for e in middle)
    assert {e["id"] for e in events[:-1]} == {first["id"]}
    assert all(len(e["choices"][0]["token_ids"]) == 1 for e in middle)
    assert all(e["choices"][0]["finish_reason"] is None for e in middle[:-1])
    assert middle[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert middle[-1]["choices"][0]["delta"] == {}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(middle)
    assert usage["usage"]["prompt_tokens"] == len(first["prompt_token_ids"])


def test_deltas_add_up_to_the_non_streamed_reply(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[TURN]))
    body = wire.chat_body([wire.SYSTEM, wire.USER])
    full = wire.post_chat(engine, body).json()
    streamed = _assemble(wire.read_sse(engine, body))
    choice = full["choices"][0]
    assert streamed["token_ids"] == choice["token_ids"]
    assert [e["logprob"] for e in streamed["logprobs"]] == [e["logprob"] for e in choice["logprobs"]["content"]]
    assert streamed["message"]["content"] == choice["message"]["content"] == "Let me check."
    assert streamed["message"]["reasoning"] == choice["message"]["reasoning"] == "Look around first."
    calls = [streamed["message"]["tool_calls"][i] for i in sorted(streamed["message"]["tool_calls"])]
    assert [c["name"] for c in calls] == [c["function"]["name"] for c in choice["message"]["tool_calls"]]
    # spaced object arguments: the sampled text is the re-serialization; a raw string streams as sampled
    assert calls[0]["arguments"] == choice["message"]["tool_calls"][0]["function"]["arguments"] == '{"command": "ls -la"}'
    assert calls[1]["arguments"] == '{"path":  "notes.txt"}'
    assert choice["message"]["tool_calls"][1]["function"]["arguments"] == '{"path": "notes.txt"}'
    assert all(c["id"].startswith("chatcmpl-tool-") for c in calls)
    assert streamed["finish_reason"] == choice["finish_reason"] == "tool_calls"


def test_tool_call_deltas_start_with_id_type_and_name(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[TURN]))
    events = wire.read_sse(engine, wire.chat_body([wire.USER]))
    chunks = [e["choices"][0] for e in events if e != "[DONE]" and e["choices"]]
    deltas = [call for chunk in chunks for call in chunk["delta"].get("tool_calls", [])]
    heads = [d for d in deltas if "id" in d]
    assert [(h["index"], h["type"], h["function"]) for h in heads] == [(0, "function", {"name": "bash"}),
                                                                      (1, "function", {"name": "read"})]
    assert all(c["delta"]["content"] is None for c in chunks if "tool_calls" in c["delta"])  # hermes says null
    for head in heads:
        later = deltas[deltas.index(head) + 1:]
        assert all("id" not in d and "name" not in d.get("function", {}) for d in later if d["index"] == head["index"])


def test_no_usage_chunk_unless_asked_and_no_ids_unless_asked(engine: EngineServer, wire) -> None:
    events = wire.read_sse(engine, {"messages": [wire.USER], "tools": wire.TOOLS})
    assert events[-1] == "[DONE]"
    assert all(e["choices"] for e in events[:-1])
    assert events[0]["prompt_token_ids"] is None
    assert all(e["choices"][0]["token_ids"] is None for e in events[1:-1])
    assert all(e["choices"][0]["logprobs"] is None for e in events[1:-1])
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-1]) == "Done."


def test_multibyte_text_streams_whole_characters(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[Turn(content="Snow ☃ and 日本")]))
    events = wire.read_sse(engine, wire.chat_body([wire.USER]))
    pieces = [e["choices"][0]["delta"].get("content") for e in events[1:-1]]
    assert "".join(p for p in pieces if p) == "Snow ☃ and 日本"
    assert "\ufffd" not in "".join(p for p in pieces if p)
    assert any(p is None for p in pieces), "tokens holding part of a character carry no text"


def test_length_finish_in_a_stream(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[Turn(content="A long answer with many words.")]))
    events = wire.read_sse(engine, wire.chat_body([wire.USER], max_tokens=3))
    tokens = [e for e in events[1:-1] if e["choices"]]
    assert len(tokens) == 3 and tokens[-1]["choices"][0]["finish_reason"] == "length"


def test_empty_turns(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[Turn(content="")]))
    events = wire.read_sse(engine, wire.chat_body([wire.USER]))
    assert len(events) == 3 and events[-1] == "[DONE]"
    last = events[1]["choices"][0]
    assert last["delta"] == {} and last["finish_reason"] == "stop" and len(last["token_ids"]) == 1
    engine.set_script("*", Script(turns=[Turn(content="", finish_reason="length")]))
    events = wire.read_sse(engine, wire.chat_body([wire.USER]))
    assert events[1]["choices"][0]["finish_reason"] == "length" and events[1]["choices"][0]["token_ids"] == []
    plain = wire.post_chat(engine, wire.chat_body([wire.USER])).json()["choices"][0]
    assert (plain["message"]["content"], plain["finish_reason"], plain["token_ids"]) == ("", "length", [])


def test_fields_of_vllm_0_32_on_first_finish_and_usage_chunks(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[Turn(content="Hello there.")]))
    with_usage = wire.read_sse(engine, wire.chat_body([wire.USER], stream_options={"include_usage": True},
                                                      return_prompt_text=True))
    first, *tokens, usage, _ = with_usage
    assert first["prompt_text"].endswith("<|im_start|>assistant\n")  # asked for with return_prompt_text
    assert all("system_fingerprint" not in e for e in [first, *tokens])
    assert usage["system_fingerprint"].startswith("vllm-") and usage["choices"] == []
    assert tokens[-1]["choices"][0]["stop_reason"] is None
    assert all("stop_reason" not in e["choices"][0] for e in tokens[:-1])
    plain = wire.read_sse(engine, wire.chat_body([wire.USER]))
    assert plain[0]["prompt_text"] is None
    assert plain[-2]["choices"][0]["finish_reason"] == "stop" and plain[-2]["system_fingerprint"].startswith("vllm-")


def test_a_hermes_call_is_announced_once_its_name_is_complete(engine: EngineServer, wire) -> None:
    from openenv_harness.testing.engine.tokenizer import reference_tokenizer

    engine.set_script("*", Script(turns=[Turn(tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls"})])]))
    events = wire.read_sse(engine, wire.chat_body([wire.USER]))
    chunks = [e["choices"][0] for e in events[1:-1]]
    head = next(i for i, c in enumerate(chunks) if c["delta"].get("tool_calls"))
    text_so_far = reference_tokenizer().decode([t for c in chunks[: head + 1] for t in c["token_ids"]])
    assert '"name": "bash"' in text_so_far
    before = reference_tokenizer().decode([t for c in chunks[:head] for t in c["token_ids"]])
    assert '"name": "bash"' not in before and all(c["delta"] == {} for c in chunks[:head])
