"""The reference engine answers like the real vLLM 0.32 wherever a client can see it.

One request corpus goes to both engines: the real vLLM (serving the real Qwen2.5 model) and the
reference engine configured as its mirror (the same served name, context length, tokenizer,
chat template and generation config, read off the real one). Replies are compared by *shape*
(``openenv_harness.testing.shapes``: keys and JSON types, ``null`` or not; values may differ), so
a vLLM upgrade that adds, drops or retypes a field fails here instead of surprising the recorder.
Prompt ids are compared by *value*: with the same tokenizer and template, vLLM's message
preprocessing and ours must give the same ids.

What the model says is never asserted (a 0.5B model's words are not stable); the reference
engine is scripted to answer in the same form (text, or a tool call under ``tool_choice:
"required"``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from real_stack import MODEL, THINK_TEMPLATE
from openenv_harness.engine import VLLMServer
from openenv_harness.testing.engine import EngineConfig, EngineServer, Script, ToolCallSpec, Turn
from openenv_harness.testing.shapes import assert_same_shape, assert_same_stream_shape

pytestmark = [pytest.mark.real_engine]

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
EVIDENCE = {"return_token_ids": True, "logprobs": True, "top_logprobs": 0}
PINNED = {"temperature": 0, "seed": 0}
USER = {"role": "user", "content": "Say hi"}
TOOL_USER = {"role": "user", "content": "List the files in this folder."}
CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"}


def _replay(**reasoning: str) -> list[dict[str, Any]]:
    """A tool loop with the assistant's reasoning replayed under a given field name."""
    return [TOOL_USER, {"role": "assistant", "content": "", "tool_calls": [CALL], **reasoning}, TOOL_RESULT]


#: messages whose preprocessing differs between a naive renderer and vLLM (measured on 0.32)
PREPROCESSING = {
    "reasoning": _replay(reasoning="I should list them."),
    "reasoning_content": _replay(reasoning_content="I should list them."),
    "thinking": _replay(thinking="I should list them."),
    "parts": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Ok?"}]},
              {"role": "user", "content": [{"type": "text", "text": "List"}, {"type": "text", "text": "files"}]},
              {"role": "assistant", "content": [{"type": "text", "text": "Listing."}], "tool_calls": [CALL]},
              {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "a.txt"}]}],
    "arguments": [TOOL_USER, {"role": "assistant", "content": None, "tool_calls": [
        {**CALL, "function": {"name": "bash", "arguments": '{"command":"ls",  "n" :1.0}'}},
        {**CALL, "id": "call_2", "function": {"name": "bash", "arguments": "{not json"}}]}, TOOL_RESULT],
    "empty_tool_calls": [USER, {"role": "assistant", "content": "Hi!", "tool_calls": []},
                         {"role": "user", "content": "Again."}],
    "developer": [{"role": "developer", "content": "Answer in French."}, USER],
}
ODD_TOOLS = [{"type": "function", "function": {"parameters": {"type": "object"}, "name": "zed", "extra": 1}, "x": 2}]


class Pair:
    """The same request to both engines."""

    def __init__(self, real: str, reference: str) -> None:
        self.real, self.reference = httpx.Client(base_url=real, timeout=600), httpx.Client(base_url=reference,
                                                                                           timeout=60)

    def send(self, method: str, path: str, **kwargs: Any) -> tuple[httpx.Response, httpx.Response]:
        return self.real.request(method, path, **kwargs), self.reference.request(method, path, **kwargs)

    def same_shape(self, method: str, path: str, what: str, **kwargs: Any) -> tuple[Any, Any]:
        real, ref = self.send(method, path, **kwargs)
        assert real.status_code == ref.status_code, (what, real.status_code, real.text, ref.status_code, ref.text)
        if not real.content:
            assert ref.content == b"", (what, ref.text)
            return None, None
        assert_same_shape(real.json(), ref.json(), what)
        return real.json(), ref.json()

    def streams(self, body: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        return _events(self.real, body), _events(self.reference, body)

    def close(self) -> None:
        self.real.close()
        self.reference.close()


def _events(client: httpx.Client, body: dict[str, Any]) -> list[Any]:
    events: list[Any] = []
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: "):
                payload = line[len("data: "):]
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def mirror_config(real_url: str, **overrides: Any) -> EngineConfig:
    """A reference engine configured like the real one, from what the real one says about itself."""
    card = httpx.get(real_url + "/v1/models", timeout=30).json()["data"][0]
    script = Script(turns=[Turn(tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls"})])],
                    repeat_last=True)
    settings: dict[str, Any] = dict(served_model_name=card["id"], max_model_len=card["max_model_len"],
                                    reasoning_parser=None, strict_model_name=True, default_script=script)
    return EngineConfig.for_model(Path(card["root"]), **{**settings, **overrides})


@pytest.fixture(scope="module")
def pair(vllm: VLLMServer) -> Iterator[Pair]:
    with EngineServer(mirror_config(vllm.url)) as reference:
        engines = Pair(vllm.url, reference.url)
        try:
            yield engines
        finally:
            engines.close()


def _chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, **PINNED, **extra}


def _tool_chat(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return _chat(messages, tools=TOOLS, tool_choice="required", max_tokens=48, **extra)


def test_plain_replies(pair: Pair) -> None:
    for name, extra in (("with token evidence", EVIDENCE), ("plain", {})):
        real, _ = pair.same_shape("POST", "/v1/chat/completions", f"chat reply {name}",
                                  json=_chat([USER], max_tokens=3, **extra))
        assert real["choices"][0]["finish_reason"] == "length"  # the corpus is what it means to be


def test_streamed_replies(pair: Pair) -> None:
    body = _chat([USER], max_tokens=3, stream_options={"include_usage": True}, **EVIDENCE)
    real, ref = pair.streams(body)
    assert_same_stream_shape(real, ref, "stream with usage and token evidence")
    real, ref = pair.streams(_chat([USER], max_tokens=3))
    assert_same_stream_shape(real, ref, "plain stream (finish chunk carries the fingerprint)")


def test_tool_calls_under_required(pair: Pair) -> None:
    real, _ = pair.same_shape("POST", "/v1/chat/completions", "tool-call reply", json=_tool_chat([TOOL_USER], **EVIDENCE))
    assert real["choices"][0]["message"]["tool_calls"], "the real model made no tool call"
    real_events, ref_events = pair.streams(_tool_chat([TOOL_USER], stream_options={"include_usage": True}, **EVIDENCE))
    assert_same_stream_shape(real_events, ref_events, "streamed tool call")
    heads = [c for e in real_events[:-1] for ch in e["choices"] for c in ch["delta"].get("tool_calls", []) if "id" in c]
    assert heads and all("arguments" not in h["function"] for h in heads)


def test_reasoning_replayed_in_history(pair: Pair) -> None:
    for field in ("reasoning", "reasoning_content"):
        messages = PREPROCESSING[field]
        pair.same_shape("POST", "/v1/chat/completions", f"reply after {field} in history",
                        json=_tool_chat(messages, **EVIDENCE))
        real, ref = pair.streams(_tool_chat(messages, stream_options={"include_usage": True}))
        assert_same_stream_shape(real, ref, f"stream after {field} in history")


def test_errors(pair: Pair) -> None:
    too_long, _ = pair.same_shape("POST", "/v1/chat/completions", "max_tokens above max_model_len",
                                  json=_chat([USER], max_tokens=20000))
    assert too_long["error"]["param"] == "max_tokens"
    unknown, _ = pair.same_shape("POST", "/v1/chat/completions", "unknown model",
                                 json={**_chat([USER], max_tokens=2), "model": "no-such-model"})
    assert unknown["error"]["code"] == 404
    # vLLM 0.32 refuses an empty tools array on the chat and render routes (0.34 treats it as omitted)
    for route in ("/v1/chat/completions", "/v1/chat/completions/render"):
        real, ref = pair.same_shape("POST", route, f"empty tools on {route}", json={**_chat([USER], max_tokens=2),
                                                                                     "tools": []})
        assert real == ref and real["error"]["param"] == "tools", (real, ref)
    # the chat route's weight-version spans are 0.33's: 0.32 ignores the request field
    real, ref = pair.same_shape("POST", "/v1/chat/completions", "return_weight_versions (ignored by 0.32)",
                                json={**_chat([USER], max_tokens=2), "return_weight_versions": True})
    assert "weight_versions" not in real["choices"][0] and "weight_versions" not in ref["choices"][0]


def test_fence(pair: Pair) -> None:
    pair.same_shape("GET", "/is_paused", "is_paused")
    try:
        paused, _ = pair.same_shape("POST", "/pause", "pause (keep)", params={"mode": "keep"})
        assert paused == {"status": "paused"}
        pair.same_shape("GET", "/is_paused", "is_paused while paused")
    finally:
        pair.same_shape("POST", "/resume", "resume")  # the real engine is shared: never left paused
    pair.same_shape("POST", "/pause", "pause with a bad mode", params={"mode": "later"})
    assert pair.real.get("/is_paused").json() == {"is_paused": False}


#: what a disk weight sync uses (``trainer/weight_sync.py``), served in vLLM's dev mode
SYNC_ROUTES = {"/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/weight_info", "/pause", "/resume"}


def test_weight_routes(pair: Pair) -> None:
    """The weight sync's routes on both engines: listed in ``/openapi.json``, and answered alike. The
    real engine is shared: its label is set to the one it has, and the folder it reloads is its own."""
    real_paths = set(pair.real.get("/openapi.json").json()["paths"])
    ref_paths = set(pair.reference.get("/openapi.json").json()["paths"])
    assert SYNC_ROUTES <= real_paths and SYNC_ROUTES <= ref_paths, (SYNC_ROUTES - real_paths, SYNC_ROUTES - ref_paths)
    assert ref_paths <= real_paths, ref_paths - real_paths  # the reference engine lists no route vLLM lacks
    label, _ = pair.same_shape("GET", "/weight_info", "weight_info")
    pair.same_shape("POST", "/update_weight_version", "update_weight_version",
                    json={"new_version": label["weight_version"]})
    root = pair.real.get("/v1/models").json()["data"][0]["root"]
    real, ref = pair.same_shape("POST", "/collective_rpc", "reload_weights of the served folder",
                                json={"method": "reload_weights", "kwargs": {"weights_path": root}})
    assert real == ref == {"results": [None]}
    real, ref = pair.same_shape("POST", "/reset_prefix_cache", "reset_prefix_cache")
    assert real == ref == {"success": True}
    real, ref = pair.same_shape("POST", "/collective_rpc", "collective_rpc without a method", json={"kwargs": {}})
    assert real == ref, (real, ref)


def test_small_routes(pair: Pair) -> None:
    pair.same_shape("POST", "/tokenize", "tokenize (chat form)", json={"model": MODEL, "messages": [USER]})
    pair.same_shape("POST", "/tokenize", "tokenize (prompt form)", json={"model": MODEL, "prompt": "hello world"})
    real, ref = pair.same_shape("POST", "/tokenize", "tokenize with token strings",
                                json={"model": MODEL, "prompt": "hello world", "return_token_strs": True})
    assert real == ref  # same tokenizer: same ids and the same vocabulary strings ("Ġworld")
    pair.same_shape("POST", "/detokenize", "detokenize", json={"model": MODEL, "tokens": real["tokens"]})
    real_models, ref_models = pair.same_shape("GET", "/v1/models", "models")
    assert real_models["data"][0]["max_model_len"] == ref_models["data"][0]["max_model_len"]
    pair.same_shape("GET", "/version", "version")
    pair.same_shape("GET", "/health", "health")


def _prompt_ids(client: httpx.Client, route: str, messages: list[dict[str, Any]], tools: Any) -> list[int] | int:
    body: dict[str, Any] = {"model": MODEL, "messages": messages}
    if tools:
        body["tools"] = tools
    if route == "chat":
        body.update(max_tokens=1, return_token_ids=True, **PINNED)
        reply = client.post("/v1/chat/completions", json=body)
        return reply.json()["prompt_token_ids"] if reply.status_code == 200 else reply.status_code
    if route == "render":  # the scale-out route: a chat request's prompt ids, validated as the chat route does
        reply = client.post("/v1/chat/completions/render", json=body)
        return reply.json()["token_ids"] if reply.status_code == 200 else reply.status_code
    reply = client.post("/tokenize", json=body)
    return reply.json()["tokens"] if reply.status_code == 200 else reply.status_code


def _assert_same_prompt_ids(pair: Pair, cases: dict[str, list[dict[str, Any]]]) -> None:
    different = []
    for name, messages in cases.items():
        for tools in (TOOLS, ODD_TOOLS, None):
            for route in ("chat", "tokenize", "render"):
                real = _prompt_ids(pair.real, route, messages, tools)
                ref = _prompt_ids(pair.reference, route, messages, tools)
                if real != ref:
                    shown = [c.post("/detokenize", json={"tokens": ids}).json()["prompt"][-240:]
                             if isinstance(ids, list) else ids for c, ids in ((pair.real, real), (pair.reference, ref))]
                    different.append(f"{name} ({route}, tools={bool(tools)}): real {shown[0]!r} / reference {shown[1]!r}")
    assert not different, "prompt ids differ:\n  " + "\n  ".join(different)


def test_message_preprocessing_gives_the_real_prompt_ids(pair: Pair) -> None:
    _assert_same_prompt_ids(pair, PREPROCESSING)


def test_the_render_route_renders_as_the_chat_route_does(pair: Pair) -> None:
    """Template certification probes through the render route because its ids are the chat route's
    (the same request validation, so the same field renames): held here for every preprocessing case."""
    for name, messages in PREPROCESSING.items():
        for tools in (TOOLS, None):
            chat = _prompt_ids(pair.real, "chat", messages, tools)
            assert isinstance(chat, list) and _prompt_ids(pair.real, "render", messages, tools) == chat, name


@pytest.fixture(scope="module")
def qwen3_pair(think_vllm: VLLMServer) -> Iterator[Pair]:
    """The second real vLLM, serving TRL's Qwen3.5 think template (it renders replayed reasoning), and
    its mirror."""
    import trl

    template = Path(trl.__file__).parent / "chat_templates" / THINK_TEMPLATE
    with EngineServer(mirror_config(think_vllm.url, chat_template=template)) as reference:
        engines = Pair(think_vllm.url, reference.url)
        yield engines
        engines.close()


@pytest.mark.slow
def test_reasoning_replay_follows_the_field_name_and_the_route(qwen3_pair: Pair) -> None:
    """vLLM 0.32 renders ``reasoning``; ``reasoning_content`` only on the chat and render routes (their
    request validation renames it; ``/tokenize`` drops it); ``thinking`` never. The reference engine
    must give the same ids in all nine cases."""
    cases = {name: PREPROCESSING[name] for name in ("reasoning", "reasoning_content", "thinking")}
    _assert_same_prompt_ids(qwen3_pair, cases)

    def rendered(route: str, name: str) -> bool:
        ids = _prompt_ids(qwen3_pair.real, route, cases[name], TOOLS)
        assert isinstance(ids, list), ids
        return "I should list them." in qwen3_pair.real.post("/detokenize", json={"tokens": ids}).json()["prompt"]

    assert [rendered(route, name) for name in cases for route in ("chat", "tokenize", "render")] == [
        True, True, True, True, False, True, False, False, False]
