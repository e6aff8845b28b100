"""Synthetic SSE: vLLM's chunk order, always a real finish_reason, usage on request, [DONE] last."""

from __future__ import annotations

import orjson

from openenv_harness.recorder.edge.sse import synthesize_sse


def frames(body: bytes) -> list:
    out = []
    for block in body.decode().split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: ")
        payload = block[len("data: "):]
        out.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return out


def reply(message: dict, finish: str | None) -> dict:
    return {"id": "chatcmpl-9", "created": 5, "model": "m",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


def test_tool_call_stream_shape() -> None:
    msg = {"role": "assistant", "content": "", "reasoning": "think",
           "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}},
                          {"id": "call_2", "type": "function", "function": {"name": "read", "arguments": "{}"}}]}
    fs = frames(synthesize_sse(reply(msg, "tool_calls"), include_usage=True))
    assert fs[-1] == "[DONE]"
    assert fs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert fs[1]["choices"][0]["delta"] == {"reasoning": "think"}
    heads = [f["choices"][0]["delta"]["tool_calls"][0] for f in fs[2:6]]
    assert heads[0] == {"index": 0, "id": "call_1", "type": "function", "function": {"name": "bash", "arguments": ""}}
    assert heads[1] == {"index": 0, "function": {"arguments": "{\"command\": \"ls\"}"}}
    assert heads[2]["index"] == 1 and heads[2]["id"] == "call_2"
    assert fs[6]["choices"][0]["finish_reason"] == "tool_calls"
    assert fs[7]["choices"] == [] and fs[7]["usage"]["total_tokens"] == 5
    assert all(f["object"] == "chat.completion.chunk" and f["id"] == "chatcmpl-9" for f in fs[:-1])


def test_missing_finish_reason_is_never_sent_as_null() -> None:
    fs = frames(synthesize_sse(reply({"role": "assistant", "content": "hi"}, None), include_usage=False))
    finishes = [f["choices"][0]["finish_reason"] for f in fs[:-1]]
    assert finishes[-1] == "stop" and all(x is None for x in finishes[:-1])
    assert not any(f["choices"] == [] for f in fs[:-1])  # no usage chunk unless asked
    fs = frames(synthesize_sse(reply({"role": "assistant", "content": None,
                                      "tool_calls": [{"id": "c", "function": {"name": "x", "arguments": "{}"}}]}, None),
                               include_usage=False))
    assert fs[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_openai_sdk_accumulates_the_stream() -> None:
    """The OpenAI Python SDK (what many agents embed) parses our stream into the same message."""
    import httpx
    import openai

    msg = {"role": "assistant", "content": "done", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}}]}
    body = synthesize_sse(reply(msg, "tool_calls"), include_usage=True)
    transport = httpx.MockTransport(lambda req: httpx.Response(200, content=body,
                                                               headers={"content-type": "text/event-stream"}))
    client = openai.OpenAI(api_key="k", base_url="http://x/v1", http_client=httpx.Client(transport=transport))
    content, args, names, finish, usage = "", "", [], None, None
    for chunk in client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}], stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                if tc.function and tc.function.name:
                    names.append(tc.function.name)
                args += (tc.function.arguments or "") if tc.function else ""
            finish = c.finish_reason or finish
    assert (content, names, args, finish) == ("done", ["bash"], "{\"command\":\"ls\"}", "tool_calls")
    assert usage is not None and usage.total_tokens == 5
