"""A continued incremental call streamed to an agent that asked for a stream, read by the OpenAI SDK."""

from __future__ import annotations

import json
from typing import Any

import openai

from openenv_harness.recorder import RecorderClient, RecorderServer
from openenv_harness.testing.engine import EngineServer, Script, ToolCallSpec, Turn

from agentloop import TOOLS


def _streamed(client: openai.OpenAI, messages: list[dict[str, Any]]) -> tuple[dict[str, Any], str, int]:
    """One streamed call through the SDK's own accumulator: the message, finish reason, usage."""
    with client.chat.completions.stream(model="reference-model", messages=messages, tools=TOOLS,  # type: ignore[arg-type]
                                        max_tokens=256, stream_options={"include_usage": True}) as stream:
        kinds = {event.type for event in stream}
        final = stream.get_final_completion()
    assert {"chunk", "content.done"} <= kinds or {"chunk", "tool_calls.function.arguments.done"} <= kinds, kinds
    choice = final.choices[0]
    message = choice.message.model_dump(exclude_none=True)
    message["reasoning"] = (choice.message.model_extra or {}).get("reasoning")
    assert final.usage is not None
    return message, choice.finish_reason, final.usage.completion_tokens


def test_a_continued_call_streams_what_the_engine_parsed(engine: EngineServer, recorder: RecorderServer,
                                                        admin: RecorderClient) -> None:
    s = admin.create_session(prompt_mode="incremental", prompt_mode_strict=True)
    engine.set_script(s["session_id"], Script(turns=[
        Turn(reasoning="List first.", content="Looking.", tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls"})]),
        Turn(reasoning="Then read it.", content="Reading a.py.",
             tool_calls=[ToolCallSpec(name="read", arguments='{"path":  "a.py"}')]),
        Turn(content="All done.")]))
    client = openai.OpenAI(base_url=s["base_url"], api_key=s["secret"], max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Do the task."}]
    got = []
    for _ in range(3):
        message, finish, n = _streamed(client, messages)
        got.append((message, finish, n))
        if not message.get("tool_calls"):
            break
        calls = [{"id": c["id"], "type": "function", "function": c["function"]} for c in message["tool_calls"]]
        messages += [{"role": "assistant", "content": message.get("content"), "reasoning": message["reasoning"],
                      "tool_calls": calls},
                     *({"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls)]
    records = admin.records(s["session_id"])
    assert [r["metadata"]["prompt_mode"]["continued"] for r in records] == [False, True, True]
    for (message, finish, n), record in zip(got, records):
        sent = record["response"]["choices"][0]
        assert finish == sent["finish_reason"]
        assert n == len(record["completion_token_ids"])
        assert message.get("content") == sent["message"]["content"]
        assert message["reasoning"] == sent["message"].get("reasoning")
        assert [c["function"] for c in message.get("tool_calls") or []] == \
            [c["function"] for c in sent["message"].get("tool_calls") or []]
    # the continued call's tool call, parsed by the engine's tool parser out of the sampled ids
    call = got[1][0]["tool_calls"][0]["function"]
    assert call["name"] == "read" and json.loads(call["arguments"]) == {"path": "a.py"}
    assert got[1][1] == "tool_calls" and got[2][0]["content"] == "All done."
