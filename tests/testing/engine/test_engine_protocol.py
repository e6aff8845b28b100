"""The lean routes answered from the HTTP parser (``protocol.py``) put on the wire the bytes the ASGI
path does: each case sends the same raw request bytes to an engine served by the protocol and to one
served by plain uvicorn (``http="httptools"``: every request through the ASGI app), and compares every
reply byte for byte -- status line, headers and their order, framing, body -- and whether the server
closed the connection after them. Only what differs between any two calls is masked: the Date
header, random ids (uuid hex) and ``created`` timestamps."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from openenv_harness.testing.engine import EngineConfig, EngineServer, Fault, Script, ToolCallSpec, Turn
from openenv_harness.testing.engine.protocol import EngineProtocol, _Answering, engine_protocol_class

CHAT = {"model": "reference-model", "messages": [{"role": "user", "content": "list the files"}],
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]}
SESSION = "sess-protocol"
SCRIPT = Script(turns=[Turn(tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls"})]),
                       Turn(content="Done.")])


def _engines(config: EngineConfig | None = None) -> Iterator[tuple[EngineServer, EngineServer]]:
    with EngineServer(config) as raw, EngineServer(config, http="httptools") as asgi:
        yield raw, asgi


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[EngineServer, EngineServer]]:
    yield from _engines()


@pytest.fixture(autouse=True)
def _fresh(request: pytest.FixtureRequest) -> None:
    if "pair" in request.fixturenames:
        for engine in request.getfixturevalue("pair"):
            engine.reset()
            engine.set_script(SESSION, SCRIPT)


def _request(path: str, body: Any = None, *, raw: bytes | None = None, method: bytes = b"POST",
             headers: dict[str, str] | None = None, version: bytes = b"1.1") -> bytes:
    data = raw if raw is not None else (orjson.dumps(body) if body is not None else b"")
    head = [b"%s %s HTTP/%s" % (method, path.encode(), version), b"host: 127.0.0.1",
            b"content-type: application/json", b"content-length: %d" % len(data)]
    head += [f"{k}: {v}".encode() for k, v in (headers or {}).items()]
    return b"\r\n".join(head) + b"\r\n\r\n" + data


def _one_reply(data: bytes) -> tuple[bytes, bytes] | None:
    """The first complete reply in ``data`` (its raw bytes, framing included) and what follows."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = data[:end].decode("latin-1").lower()
    at = end + 4
    length = re.search(r"\r\ncontent-length: (\d+)", head)
    if length:
        at += int(length.group(1))
        return (data[:at], data[at:]) if len(data) >= at else None
    if "transfer-encoding: chunked" not in head:
        return data[:at], data[at:]
    while True:
        line_end = data.find(b"\r\n", at)
        if line_end < 0:
            return None
        size = int(data[at:line_end], 16)
        at = line_end + 2 + size + 2
        if len(data) < at:
            return None
        if size == 0:
            return data[:at], data[at:]


def _exchange(engine: EngineServer, pieces: list[bytes], replies: int) -> tuple[list[bytes], str]:
    """Send ``pieces`` on one connection; the replies read back, and what became of the connection
    after them ("open", "closed" or "reset")."""
    out: list[bytes] = []
    with socket.create_connection(("127.0.0.1", engine.port), timeout=20) as sock:
        for piece in pieces:
            sock.sendall(piece)
        data = b""
        try:
            while len(out) < replies:
                found = _one_reply(data)
                if found is not None:
                    out.append(found[0])
                    data = found[1]
                    continue
                more = sock.recv(65536)
                if not more:
                    return out, "closed"
                data += more
            sock.settimeout(0.3)
            try:
                return out, "closed" if not sock.recv(65536) else "more bytes"
            except TimeoutError:
                return out, "open"
        except ConnectionResetError:
            return out, "reset"


_MASKS = [(re.compile(rb"\r\ndate: [^\r]*"), b"\r\ndate: -"), (re.compile(rb"[0-9a-f]{32}"), b"<hex>"),
          (re.compile(rb'"created":\d+'), b'"created":0')]


def _masked(reply: bytes) -> bytes:
    for pattern, replacement in _MASKS:
        reply = pattern.sub(replacement, reply)
    return reply


def _same(pair: tuple[EngineServer, EngineServer], pieces: list[bytes], replies: int = 1) -> list[bytes]:
    """Both engines' replies to the same bytes, asserted equal; the protocol's, masked."""
    raw, asgi = pair
    got, got_end = _exchange(raw, pieces, replies)
    want, want_end = _exchange(asgi, pieces, replies)
    assert [_masked(r) for r in got] == [_masked(r) for r in want]
    assert got_end == want_end
    assert len(got) == replies, (got, got_end)
    return [_masked(r) for r in got]


def _render(pair: tuple[EngineServer, EngineServer]) -> dict[str, Any]:
    return orjson.loads(_exchange(pair[0], [_request("/v1/chat/completions/render", CHAT)], 1)[0][0].split(
        b"\r\n\r\n", 1)[1])


def test_the_engine_serves_with_the_protocol_and_lean_requests_take_it(pair) -> None:
    raw, asgi = pair
    assert engine_protocol_class() is EngineProtocol
    with socket.create_connection(("127.0.0.1", raw.port)) as sock:
        sock.sendall(_request("/v1/chat/completions/render", CHAT))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
        (protocol,) = raw._server.server_state.connections  # type: ignore[union-attr]
        assert isinstance(protocol, EngineProtocol) and isinstance(protocol.cycle, _Answering)
    with socket.create_connection(("127.0.0.1", asgi.port)) as sock:
        sock.sendall(_request("/v1/chat/completions/render", CHAT))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
        (protocol,) = asgi._server.server_state.connections  # type: ignore[union-attr]
        assert not isinstance(protocol, EngineProtocol)


def test_render_answers_and_errors(pair) -> None:
    (ok,) = _same(pair, [_request("/v1/chat/completions/render", CHAT)])
    assert ok.startswith(b"HTTP/1.1 200 OK\r\n") and b'"token_ids":[' in ok
    (bad,) = _same(pair, [_request("/v1/chat/completions/render", raw=b"{not json")])
    assert bad.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"Invalid JSON body" in bad
    (invalid,) = _same(pair, [_request("/v1/chat/completions/render", {"model": "reference-model"})])
    assert invalid.startswith(b"HTTP/1.1 400 ") and b"messages" in invalid
    (empty,) = _same(pair, [_request("/v1/chat/completions/render")])
    assert empty.startswith(b"HTTP/1.1 400 ")


def test_generate_derender_and_id_completions_answer_alike(pair) -> None:
    rendered = _render(pair)
    generate = {"token_ids": rendered["token_ids"], "sampling_params": rendered["sampling_params"]}
    (generated,) = _same(pair, [_request("/inference/v1/generate", generate, headers={"x-openenv-harness-session": SESSION})])
    assert generated.startswith(b"HTTP/1.1 200 OK\r\n")
    generated_body = orjson.loads(generated.split(b"\r\n\r\n", 1)[1])
    derender = {"generate_response": generated_body, "prompt_token_ids": rendered["token_ids"][-64:],
                "prompt_tokens": len(rendered["token_ids"]), "chat_request": CHAT}
    (derendered,) = _same(pair, [_request("/v1/chat/completions/derender", derender)])
    assert b'"tool_calls":[' in derendered
    completion = {"model": "reference-model", "prompt": rendered["token_ids"], "max_tokens": 32,
                  "return_token_ids": True, "logprobs": 0}
    (completed,) = _same(pair, [_request("/v1/completions", completion)])
    assert completed.startswith(b"HTTP/1.1 200 OK\r\n") and b'"text_completion"' in completed
    (out_of_vocabulary,) = _same(pair, [_request("/inference/v1/generate", {
        **generate, "token_ids": [*rendered["token_ids"], -3, 10**9]})])
    assert out_of_vocabulary.startswith(b"HTTP/1.1 400 ") and b"out of vocabulary: [-3, 1000000000]" in out_of_vocabulary
    (streamed_generate,) = _same(pair, [_request("/inference/v1/generate", {**generate, "stream": True})])
    assert streamed_generate.startswith(b"HTTP/1.1 400 ")
    (handler_error,) = _same(pair, [_request("/v1/chat/completions/derender", {
        "generate_response": {"choices": [{"token_ids": ["x"]}]}, "chat_request": CHAT})])
    assert handler_error.startswith(b"HTTP/1.1 500 Internal Server Error\r\n") and b"ValueError" in handler_error


def test_chat_answers_json_and_streams_alike(pair) -> None:
    headers = {"x-openenv-harness-session": SESSION}
    (answer,) = _same(pair, [_request("/v1/chat/completions", {**CHAT, "return_token_ids": True, "logprobs": True},
                                      headers=headers)])
    assert b'"tool_calls":[' in answer
    (stream,) = _same(pair, [_request("/v1/chat/completions", {**CHAT, "stream": True,
                                                               "stream_options": {"include_usage": True}},
                                      headers=headers)])
    assert b"\r\ntransfer-encoding: chunked\r\n" in stream and stream.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    (bad,) = _same(pair, [_request("/v1/chat/completions", [1, 2])])
    assert bad.startswith(b"HTTP/1.1 400 ")
    (invalid,) = _same(pair, [_request("/v1/chat/completions", {**CHAT, "n": 2})])
    assert invalid.startswith(b"HTTP/1.1 400 ")


def test_keep_alive_close_http_1_0_pipelining_and_other_methods(pair) -> None:
    render = _request("/v1/chat/completions/render", CHAT)
    replies = _same(pair, [render, render, render], replies=3)  # one connection, kept open after them
    assert all(r.startswith(b"HTTP/1.1 200 OK\r\n") and b"connection:" not in r for r in replies)
    (closing,) = _same(pair, [_request("/v1/chat/completions/render", CHAT, headers={"connection": "close"})])
    assert b"\r\nconnection: close\r\n" in closing  # and the server closed (compared in _same)
    (old,) = _same(pair, [_request("/v1/chat/completions/render", CHAT, version=b"1.0")])
    assert b"\r\nconnection: close\r\n" in old
    (kept,) = _same(pair, [_request("/v1/chat/completions/render", CHAT, version=b"1.0",
                                    headers={"connection": "keep-alive"})])
    assert b"\r\nconnection: close\r\n" in kept  # uvicorn keeps no HTTP/1.0 connection open
    chat = _request("/v1/chat/completions", {**CHAT, "stream": True})
    piped = _same(pair, [render + chat + _request("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 4})], 3)
    assert [r.split(b"\r\n", 1)[0] for r in piped] == [b"HTTP/1.1 200 OK"] * 3  # in order, as sent at once
    (wrong,) = _same(pair, [_request("/v1/chat/completions/render", method=b"GET")])
    assert wrong.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
    (unknown,) = _same(pair, [_request("/v1/chat/completions/render/x", CHAT)])
    assert unknown.startswith(b"HTTP/1.1 404 ")
    expect = _same(pair, [_request("/v1/chat/completions/render", CHAT, headers={"expect": "100-continue"})], 2)
    assert [r.split(b"\r\n", 1)[0] for r in expect] == [b"HTTP/1.1 100 Continue", b"HTTP/1.1 200 OK"]


def test_faults_answer_alike(pair) -> None:
    headers = {"x-openenv-harness-session": SESSION}
    for engine in pair:
        engine.add_fault(SESSION, Fault(status=429, retry_after=2.5))
    (limited,) = _same(pair, [_request("/v1/chat/completions", CHAT, headers=headers)])
    assert limited.startswith(b"HTTP/1.1 429 Too Many Requests\r\n") and b"\r\nretry-after: 2.5\r\n" in limited
    for stream in (False, True):  # cut before the reply, and mid-stream: no complete reply either way
        for engine in pair:
            engine.add_fault(SESSION, Fault(drop=True))
        cut = _request("/v1/chat/completions", {**CHAT, "stream": stream}, headers=headers)
        outcomes = [_exchange(engine, [cut], 1) for engine in pair]
        assert outcomes[0] == outcomes[1] and outcomes[0][0] == [] and outcomes[0][1] in ("closed", "reset")
    for engine in pair:
        assert engine.info()["in_flight"] == 0  # the stream's generation was released


def test_the_api_key_is_checked_before_a_lean_route() -> None:
    for pair in _engines(EngineConfig(api_key="k")):
        (refused,) = _same(pair, [_request("/v1/chat/completions/render", CHAT)])
        assert refused.startswith(b"HTTP/1.1 401 Unauthorized\r\n")
        (allowed,) = _same(pair, [_request("/v1/chat/completions/render", CHAT, headers={"authorization": "Bearer k"})])
        assert allowed.startswith(b"HTTP/1.1 200 OK\r\n")


def test_a_client_hanging_up_mid_stream_releases_the_generation() -> None:
    for raw, asgi in _engines(EngineConfig(decode_delay_s=0.05)):
        for engine in (raw, asgi):
            engine.set_script("*", Script(turns=[Turn(content="word " * 400)]))  # ~20 s of decoding
            with socket.create_connection(("127.0.0.1", engine.port), timeout=10) as sock:
                sock.sendall(_request("/v1/chat/completions", {**CHAT, "stream": True}))
                assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")
                assert engine.info()["in_flight"] == 1
            deadline = time.monotonic() + 3  # the stream ends when the client goes, not when decoded
            while engine.info()["in_flight"] and time.monotonic() < deadline:
                time.sleep(0.02)
            assert engine.info()["in_flight"] == 0
