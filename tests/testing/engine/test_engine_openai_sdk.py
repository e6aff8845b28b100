"""The official OpenAI Python SDK consumes the reference engine's replies, tool calls included."""

from __future__ import annotations

import json

import openai
from openai.lib.streaming.chat import ChatCompletionStreamState

from openenv_harness.testing.engine import EngineServer, Script, ToolCallSpec, Turn

TURN = Turn(reasoning="Check the files.", content="Looking.",
            tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls"}),
                        ToolCallSpec(name="read", arguments={"path": "a.txt"})])


def _client(engine: EngineServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=engine.openai_base_url, api_key="sk-test", max_retries=0)


def test_non_streamed_tool_calls(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[TURN]))
    completion = _client(engine).chat.completions.create(
        model="reference-model", messages=[wire.SYSTEM, wire.USER], tools=wire.TOOLS,
        extra_body={"return_token_ids": True}, logprobs=True,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Looking."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("bash", {"command": "ls"}), ("read", {"path": "a.txt"})]
    assert choice.message.model_extra["reasoning"] == "Check the files."
    assert len(choice.logprobs.content) == len(choice.model_extra["token_ids"])
    assert completion.model_extra["prompt_token_ids"]
    assert completion.usage.completion_tokens == len(choice.model_extra["token_ids"])


def test_streamed_tool_calls_accumulate(engine: EngineServer, wire) -> None:
    engine.set_script("*", Script(turns=[TURN]))
    stream = _client(engine).chat.completions.create(
        model="reference-model", messages=[wire.SYSTEM, wire.USER], tools=wire.TOOLS, stream=True,
        stream_options={"include_usage": True}, extra_body={"return_token_ids": True},
    )
    state = ChatCompletionStreamState()
    chunks = []
    for chunk in stream:
        state.handle_chunk(chunk)
        chunks.append(chunk)
    final = state.get_final_completion()
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert message.content == "Looking."
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [
        ("bash", '{"command": "ls"}'), ("read", '{"path": "a.txt"}')]
    assert all(c.id.startswith("chatcmpl-tool-") for c in message.tool_calls)
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert chunks[0].model_extra["prompt_token_ids"]
    streamed_ids = [i for c in chunks if c.choices for i in (c.choices[0].model_extra.get("token_ids") or [])]
    assert len(streamed_ids) == chunks[-1].usage.completion_tokens


def test_sdk_surfaces_injected_errors(engine: EngineServer, wire) -> None:
    from openenv_harness.testing.engine import Fault

    engine.add_fault("*", Fault(status=400, message="bad thing"))
    try:
        _client(engine).chat.completions.create(model="reference-model", messages=[wire.USER])
    except openai.BadRequestError as exc:
        assert exc.status_code == 400 and "bad thing" in str(exc)
    else:
        raise AssertionError("the SDK should raise BadRequestError")
