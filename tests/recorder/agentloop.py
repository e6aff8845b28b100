"""Helpers for recorder tests: a minimal agent loop speaking like the real CLIs, and scripts."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from openenv_harness.testing.engine import Script, ToolCallSpec, Turn, agent_echo

ADMIN = "admin-token-for-tests-0123456789"

TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
                                      "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                     "required": ["command"]}}},
    {"type": "function", "function": {"name": "read", "description": "Read a file.",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}},
]


def tool_script(n_tool_turns: int, *, segmentation: str = "canonical", spaced_args: bool = False,
                final: str = "All done.") -> Script:
    turns = []
    for i in range(n_tool_turns):
        args: Any = {"command": f"echo step {i}"}
        if spaced_args:
            # sampled with odd spacing: neither the agent's compact replay nor the engine's tojson
            # re-rendering of it (vLLM parses replayed arguments) gives these bytes back
            args = '{"command":  "echo step %d"}' % i
        turns.append(Turn(content=None if i % 2 else f"Running step {i}.", tool_calls=[ToolCallSpec(name="bash", arguments=args)]))
    turns.append(Turn(content=final))
    return Script(turns=turns, segmentation=segmentation)  # type: ignore[arg-type]


def parse_sse(body: bytes) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Accumulate an SSE chat stream into a message; also return the raw chunks."""
    chunks = []
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    done = False
    for block in body.decode().split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[6:]
        if data == "[DONE]":
            done = True
            continue
        chunk = orjson.loads(data)
        chunks.append(chunk)
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            message["content"] += delta.get("content") or ""
            for key in ("reasoning", "reasoning_content"):
                if delta.get(key):
                    message[key] = message.get(key, "") + delta[key]
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
                if tc.get("id"):
                    slot["id"] = tc["id"]
                fn = tc.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    assert done, "stream did not end with [DONE]"
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    message["finish_reason"] = finish
    return message, chunks


def run_agent(base_url: str, secret: str, *, stream: bool, echo: str = "opencode", max_turns: int = 30,
              client: httpx.Client | None = None) -> list[dict[str, Any]]:
    """A minimal agent loop speaking like the real CLIs: tools, echoed history, tool results."""
    http = client or httpx.Client(timeout=60)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Do the task step by step."},
    ]
    replies = []
    for _ in range(max_turns):
        body: dict[str, Any] = {"model": "reference-model", "messages": messages, "tools": TOOLS, "max_tokens": 512}
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        r = http.post(f"{base_url}/chat/completions", json=body, headers={"authorization": f"Bearer {secret}"})
        assert r.status_code == 200, r.text
        if stream:
            assert r.headers["content-type"].startswith("text/event-stream")
            message, _ = parse_sse(r.content)
            finish = message.pop("finish_reason")
        else:
            data = r.json()
            message = data["choices"][0]["message"]
            finish = data["choices"][0]["finish_reason"]
        assert finish is not None
        replies.append(message)
        if not message.get("tool_calls"):
            break
        messages = messages + [agent_echo(message, echo)]  # type: ignore[arg-type]
        for call in message["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"ran {call['function']['name']}\n"})
    if client is None:
        http.close()
    return replies
