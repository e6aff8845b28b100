"""Test clients for the two dialects: read their event streams the way their SDKs do, and replay
a conversation the way Codex (verbatim items) and Claude Code (parsed ``input`` objects) do."""

from __future__ import annotations

import json
from typing import Any

import httpx

ANTHROPIC_TOOLS = [{"name": "Bash", "description": "Run a shell command.",
                    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                                     "required": ["command"]}}]
RESPONSES_TOOLS = [{"type": "function", "name": "exec_command", "description": "Run a command.", "strict": False,
                    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}]


def sse_events(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """``[(event, data)]`` of a typed event stream; every frame must have both lines."""
    events = []
    for frame in body.decode().split("\n\n"):
        if not frame.strip():
            continue
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        assert set(lines) == {"event", "data"}, frame
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"], frame
        events.append((lines["event"], data))
    return events


def anthropic_message(body: bytes) -> dict[str, Any]:
    """Accumulate a Messages stream as Anthropic's SDK does, checking the protocol on the way."""
    events = sse_events(body)
    kinds = [k for k, _ in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and kinds[-2] == "message_delta", kinds
    message = dict(events[0][1]["message"])
    message["content"] = []
    partial: dict[int, str] = {}
    open_blocks: set[int] = set()
    for kind, data in events[1:-1]:
        if kind == "content_block_start":
            assert data["index"] == len(message["content"]) and data["index"] not in open_blocks
            message["content"].append(dict(data["content_block"]))
            open_blocks.add(data["index"])
        elif kind == "content_block_delta":
            assert data["index"] in open_blocks
            block, delta = message["content"][data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "input_json_delta":
                partial[data["index"]] = partial.get(data["index"], "") + delta["partial_json"]
            else:
                raise AssertionError(f"unknown delta {delta}")
        elif kind == "content_block_stop":
            open_blocks.remove(data["index"])
            block = message["content"][data["index"]]
            if block["type"] == "tool_use":
                block["input"] = json.loads(partial.get(data["index"]) or "{}")
        elif kind == "message_delta":
            message["stop_reason"] = data["delta"]["stop_reason"]
            message["stop_sequence"] = data["delta"]["stop_sequence"]
            message["usage"] = {**message["usage"], **data["usage"]}
        else:
            raise AssertionError(f"unexpected event {kind}")
    assert not open_blocks
    message["_partial_json"] = partial
    return message


def responses_final(body: bytes) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """The final response of a Responses stream (and its events), checking the protocol on the way."""
    events = sse_events(body)
    kinds = [k for k, _ in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[-1] in ("response.completed", "response.incomplete") and kinds.count(kinds[-1]) == 1, kinds
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    final = events[-1][1]["response"]
    done = [d["item"] for k, d in events if k == "response.output_item.done"]
    assert done == final["output"]
    for index, item in enumerate(done):
        if item["type"] == "function_call":
            deltas = "".join(d["delta"] for k, d in events
                             if k == "response.function_call_arguments.delta" and d["output_index"] == index)
            assert deltas == item["arguments"]
        if item["type"] == "message":
            deltas = "".join(d["delta"] for k, d in events if k == "response.output_text.delta" and d["output_index"] == index)
            assert deltas == item["content"][0]["text"]
    return final, events


class AnthropicAgent:
    """A Claude-Code-like loop: the assistant turn is sent back as parsed content blocks."""

    def __init__(self, base: str, key: str, *, stream: bool = True, system: Any = "You are a coding agent.") -> None:
        self.url = base + "/messages"
        self.headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
        self.stream = stream
        self.body: dict[str, Any] = {"model": "policy", "max_tokens": 512, "system": system, "tools": ANTHROPIC_TOOLS,
                                     "messages": [{"role": "user", "content": "Fix the bug."}]}

    def call(self) -> dict[str, Any]:
        r = httpx.post(self.url, json={**self.body, "stream": self.stream}, headers=self.headers, timeout=60)
        assert r.status_code == 200, r.text
        if self.stream:
            assert r.headers["content-type"].startswith("text/event-stream")
            return anthropic_message(r.content)
        return r.json()

    def run(self, max_turns: int = 8) -> list[dict[str, Any]]:
        replies = []
        for _ in range(max_turns):
            reply = self.call()
            replies.append(reply)
            content = [{k: v for k, v in b.items()} for b in reply["content"]]
            self.body["messages"].append({"role": "assistant", "content": content})
            uses = [b for b in content if b["type"] == "tool_use"]
            if not uses:
                return replies
            self.body["messages"].append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": b["id"], "content": "ok"} for b in uses]})
        return replies


class ResponsesAgent:
    """A Codex-like loop: output items are sent back verbatim, followed by the tool outputs."""

    def __init__(self, base: str, key: str, *, stream: bool = True) -> None:
        self.url = base + "/responses"
        self.headers = {"authorization": f"Bearer {key}"}
        self.stream = stream
        self.body: dict[str, Any] = {"model": "policy", "tools": RESPONSES_TOOLS, "tool_choice": "auto", "store": False,
                                     "input": [{"type": "message", "role": "developer",
                                                "content": [{"type": "input_text", "text": "You are Codex."}]},
                                               {"type": "message", "role": "user",
                                                "content": [{"type": "input_text", "text": "Fix the bug."}]}]}

    def call(self) -> dict[str, Any]:
        r = httpx.post(self.url, json={**self.body, "stream": self.stream}, headers=self.headers, timeout=60)
        assert r.status_code == 200, r.text
        if self.stream:
            return responses_final(r.content)[0]
        return r.json()

    def run(self, max_turns: int = 8) -> list[dict[str, Any]]:
        replies = []
        for _ in range(max_turns):
            reply = self.call()
            replies.append(reply)
            self.body["input"].extend(reply["output"])
            calls = [i for i in reply["output"] if i["type"] == "function_call"]
            if not calls:
                return replies
            self.body["input"].extend({"type": "function_call_output", "call_id": c["call_id"], "output": "ok"}
                                      for c in calls)
        return replies


GEMINI_TOOLS = [{"functionDeclarations": [{"name": "run_shell_command", "description": "Run a shell command.",
                                           "parametersJsonSchema": {"type": "object",
                                                                    "properties": {"command": {"type": "string"}},
                                                                    "required": ["command"]}}]}]


def gemini_stream(body: bytes) -> dict[str, Any]:
    """Accumulate a ``streamGenerateContent?alt=sse`` stream as Google's SDK and Gemini CLI do:
    ``data:`` events only, parts concatenated, the finish reason and usage from the last event."""
    events = []
    for frame in body.decode().split("\r\n\r\n"):
        if not frame.strip():
            continue
        assert frame.startswith("data: ") and "\n" not in frame, frame
        events.append(json.loads(frame[len("data: "):]))
    assert events, body
    finished = [e for e in events if e["candidates"][0].get("finishReason")]
    assert finished == [events[-1]], "exactly the last event finishes"
    parts = [p for e in events for p in e["candidates"][0]["content"]["parts"]]
    last = events[-1]
    return {"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0,
                            "finishReason": last["candidates"][0]["finishReason"]}],
            "usageMetadata": last["usageMetadata"], "modelVersion": last["modelVersion"],
            "responseId": last["responseId"]}


class GeminiAgent:
    """A Gemini-CLI-like loop: the model turn is sent back as its parts (``functionCall.args`` as an
    object), followed by one user turn of ``functionResponse`` parts."""

    def __init__(self, base: str, key: str, *, stream: bool = True, model: str = "policy") -> None:
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        self.url = f"{base.removesuffix('/v1')}/v1beta/models/{model}:{method}"
        self.headers = {"x-goog-api-key": key}
        self.stream = stream
        self.body: dict[str, Any] = {
            "systemInstruction": {"role": "user", "parts": [{"text": "You are Gemini CLI."}]},
            "tools": GEMINI_TOOLS, "generationConfig": {"temperature": 0, "maxOutputTokens": 512},
            "contents": [{"role": "user", "parts": [{"text": "Fix the bug."}]}]}

    def call(self) -> dict[str, Any]:
        r = httpx.post(self.url, json=self.body, headers=self.headers, timeout=60)
        assert r.status_code == 200, r.text
        if self.stream:
            assert r.headers["content-type"].startswith("text/event-stream")
            return gemini_stream(r.content)
        return r.json()

    def run(self, max_turns: int = 8) -> list[dict[str, Any]]:
        replies = []
        for _ in range(max_turns):
            reply = self.call()
            replies.append(reply)
            content = reply["candidates"][0]["content"]
            self.body["contents"].append(content)
            calls = [p["functionCall"] for p in content["parts"] if "functionCall" in p]
            if not calls:
                return replies
            self.body["contents"].append({"role": "user", "parts": [
                {"functionResponse": {"id": c["id"], "name": c["name"], "response": {"output": "ok"}}}
                for c in calls]})
        return replies
