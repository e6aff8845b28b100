"""Requests a dialect cannot translate faithfully: a 4xx in the dialect's own error shape, and nothing
reaches the engine or the store."""

from __future__ import annotations

import json
from typing import Iterator

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineServer

from agentloop import ADMIN
from dialect_clients import ANTHROPIC_TOOLS, RESPONSES_TOOLS

MSG = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
RESP = {"model": "m", "input": "hi"}


def _with(base: dict, **changes: object) -> bytes:
    return json.dumps({**base, **changes}).encode()


def _user(*blocks: dict) -> list[dict]:
    return [{"role": "user", "content": list(blocks)}]


ANTHROPIC_CASES = {
    "not json": b"{nope",
    "array body": b"[]",
    "no messages": _with(MSG, messages=[]),
    "no max_tokens": json.dumps({"model": "m", "messages": MSG["messages"]}).encode(),
    "bad role": _with(MSG, messages=[{"role": "tool", "content": "x"}]),
    "block without type": _with(MSG, messages=_user({"text": "x"})),
    "unknown block": _with(MSG, messages=_user({"type": "document", "source": {}})),
    "thinking in a user turn": _with(MSG, messages=_user({"type": "thinking", "thinking": "x", "signature": "s"})),
    "tool_use in a user turn": _with(MSG, messages=_user({"type": "tool_use", "id": "t", "name": "Bash", "input": {}})),
    "image in an assistant turn": _with(MSG, messages=[{"role": "assistant", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}]}]),
    "tool_result without an id": _with(MSG, messages=_user({"type": "tool_result", "content": "x"})),
    "tool_use input not an object": _with(MSG, messages=[{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "Bash", "input": "ls"}]}]),
    "image block in the system prompt": _with(MSG, system=[{"type": "image", "source": {}}]),
    "server tool": _with(MSG, tools=[{"type": "web_search_20250305", "name": "web_search"}]),
    "tool without a schema": _with(MSG, tools=[{"name": "Bash"}]),
    "addition of an undeclared tool": _with(MSG, tools=ANTHROPIC_TOOLS, messages=[*MSG["messages"], {
        "role": "system", "content": [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "Nope"}}]}]),
    "bad tool_choice": _with(MSG, tool_choice={"type": "sometimes"}),
    "stream not a boolean": _with(MSG, stream="yes"),
}

RESPONSES_CASES = {
    "not json": b"{nope",
    "array body": b"[]",
    "no input": _with(RESP, input=[]),
    "unknown item": _with(RESP, input=[{"type": "custom_tool_call", "call_id": "c", "name": "x", "input": "y"}]),
    "hosted tool call item": _with(RESP, input=[{"type": "web_search_call", "id": "w"}]),
    "bad role": _with(RESP, input=[{"type": "message", "role": "tool", "content": "x"}]),
    "unknown content part": _with(RESP, input=[{"type": "message", "role": "user",
                                                "content": [{"type": "input_audio", "data": "x"}]}]),
    "arguments not a string": _with(RESP, input=[{"type": "function_call", "call_id": "c", "name": "f",
                                                  "arguments": {"a": 1}}]),
    "foreign encrypted reasoning": _with(RESP, input=[{"type": "reasoning", "id": "r", "summary": [],
                                                       "encrypted_content": "gAAAA-not-ours"}]),
    "server-side state": _with(RESP, previous_response_id="resp_1"),
    "background": _with(RESP, background=True),
    "bad tool_choice": _with(RESP, tools=RESPONSES_TOOLS, tool_choice={"type": "allowed_tools"}),
    "max_output_tokens zero": _with(RESP, max_output_tokens=0),
    "stream not a boolean": _with(RESP, stream=1),
}

GEM = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


def _model_parts(*parts: dict) -> list[dict]:
    return [*GEM["contents"], {"role": "model", "parts": list(parts)}]


GEMINI_CASES = {
    "not json": b"{nope",
    "array body": b"[]",
    "no contents": _with(GEM, contents=[]),
    "content not an object": _with(GEM, contents=["hi"]),
    "bad role": _with(GEM, contents=[{"role": "system", "parts": [{"text": "x"}]}]),
    "parts not an array": _with(GEM, contents=[{"role": "user", "parts": {"text": "x"}}]),
    "text not a string": _with(GEM, contents=[{"role": "user", "parts": [{"text": 3}]}]),
    "file data": _with(GEM, contents=[{"role": "user", "parts": [{"fileData": {"fileUri": "gs://x"}}]}]),
    "executable code": _with(GEM, contents=_model_parts({"executableCode": {"code": "print(1)"}})),
    "unknown part": _with(GEM, contents=[{"role": "user", "parts": [{"blob": "x"}]}]),
    "function call in a user turn": _with(GEM, contents=[{"role": "user", "parts": [
        {"functionCall": {"name": "f", "args": {}}}]}]),
    "function call without a name": _with(GEM, contents=_model_parts({"functionCall": {"args": {}}})),
    "args not an object": _with(GEM, contents=_model_parts({"functionCall": {"name": "f", "args": "ls"}})),
    "response answering nothing": _with(GEM, contents=[*GEM["contents"], {"role": "user", "parts": [
        {"functionResponse": {"name": "f", "response": {}}}]}]),
    "image in a system instruction": _with(GEM, systemInstruction={"parts": [{"inlineData": {"mimeType": "a",
                                                                                             "data": "b"}}]}),
    "search tool": _with(GEM, tools=[{"googleSearch": {}}]),
    "declaration without a name": _with(GEM, tools=[{"functionDeclarations": [{"description": "x"}]}]),
    "bad calling mode": _with(GEM, toolConfig={"functionCallingConfig": {"mode": "SOMETIMES"}},
                              tools=[{"functionDeclarations": [{"name": "f"}]}]),
    "two candidates": _with(GEM, generationConfig={"candidateCount": 2}),
    "max tokens zero": _with(GEM, generationConfig={"maxOutputTokens": 0}),
    "cached content": _with(GEM, cachedContent="cachedContents/abc"),
}


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, engine: EngineServer) -> Iterator[tuple[RecorderServer, RecorderClient]]:
    """One recorder for every case (each case is one refused request: nothing in it can leak)."""
    store = tmp_path_factory.mktemp("bad-input") / "r.db"
    with RecorderServer(RecorderConfig(store_path=str(store), engine_url=engine.url, admin_token=ADMIN)) as server:
        with RecorderClient(server.url, ADMIN) as admin:
            yield server, admin


def _check_cases(shared: tuple[RecorderServer, RecorderClient], engine: EngineServer, suffix: str,
                 cases: dict[str, bytes], headers_for, check) -> None:
    server, admin = shared
    s = admin.create_session()
    engine.set_script(s["session_id"], {"turns": [{"content": "ok"}]})
    for case, raw in sorted(cases.items()):
        for path in (f"/rollout/{s['session_id']}{suffix}", suffix):  # session in the path, and key-routed
            r = httpx.post(server.url + path, content=raw,
                           headers={**headers_for(s["secret"]), "content-type": "application/json"})
            assert r.status_code == 400, (case, r.text)
            check(case, r)
    assert admin.records(s["session_id"]) == []
    assert engine.requests(s["session_id"]) == []
    assert admin.session(s["session_id"])["calls"] == 0


def test_anthropic_bad_input(shared: tuple[RecorderServer, RecorderClient], engine: EngineServer) -> None:
    def check(case: str, r: httpx.Response) -> None:
        body = r.json()
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", (case, body)
        assert body["error"]["message"] and r.headers["x-should-retry"] == "false", case

    _check_cases(shared, engine, "/v1/messages", ANTHROPIC_CASES, lambda key: {"x-api-key": key}, check)


def test_responses_bad_input(shared: tuple[RecorderServer, RecorderClient], engine: EngineServer) -> None:
    def check(case: str, r: httpx.Response) -> None:
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"] and error["code"], (case, error)

    _check_cases(shared, engine, "/v1/responses", RESPONSES_CASES, lambda key: {"authorization": f"Bearer {key}"},
                 check)


def test_gemini_bad_input(shared: tuple[RecorderServer, RecorderClient], engine: EngineServer) -> None:
    def check(case: str, r: httpx.Response) -> None:
        error = r.json()["error"]
        assert set(error) == {"code", "message", "status"}, (case, error)
        assert error["code"] == 400 and error["status"] == "INVALID_ARGUMENT" and error["message"], (case, error)

    for method in ("generateContent", "streamGenerateContent"):
        _check_cases(shared, engine, f"/v1beta/models/policy:{method}", GEMINI_CASES,
                     lambda key: {"x-goog-api-key": key}, check)


def test_count_tokens_bad_input(shared: tuple[RecorderServer, RecorderClient], engine: EngineServer) -> None:
    cases = {"not json": b"{nope", "no messages": json.dumps({"model": "m", "messages": []}).encode(),
             "unknown block": json.dumps({"model": "m", "messages": _user({"type": "document"})}).encode()}

    def check(case: str, r: httpx.Response) -> None:
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error", case

    _check_cases(shared, engine, "/v1/messages/count_tokens", cases, lambda key: {"x-api-key": key}, check)


def test_oversized_bodies_are_refused_in_the_dialects_shape(small_recorder: RecorderServer,
                                                            engine: EngineServer) -> None:
    with RecorderClient(small_recorder.url, ADMIN) as admin:
        s = admin.create_session()
        big = "x" * (70 * 1024)
        gemini = "/v1beta/models/m:streamGenerateContent"
        for suffix in ("/v1/messages", "/v1/responses", "/v1/messages/count_tokens", gemini):
            body = ({"model": "m", "input": big} if suffix.endswith("responses")
                    else {"contents": [{"parts": [{"text": big}]}]} if suffix == gemini
                    else {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": big}]})
            for path in (f"/rollout/{s['session_id']}{suffix}", suffix):
                r = httpx.post(small_recorder.url + path, json=body, headers={"x-api-key": s["secret"]})
                assert r.status_code == 413, (path, r.text)
                if suffix.endswith("responses"):
                    assert r.json()["error"]["code"] == "body_too_large"
                elif suffix == gemini:
                    assert r.json()["error"]["status"] == "INVALID_ARGUMENT" and r.json()["error"]["code"] == 413
                else:
                    assert r.json()["error"]["type"] == "request_too_large"
        assert admin.records(s["session_id"]) == [] and engine.requests(s["session_id"]) == []
