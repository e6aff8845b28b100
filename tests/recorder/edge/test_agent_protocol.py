"""Chat calls answered from uvicorn's parser (``edge/agent_protocol.py``): the path every recorder test
runs on, checked here for the HTTP behaviour it takes over -- one write per reply, keep-alive,
pipelining, size limits, ``Expect: 100-continue``, HTTP/1.0, agents that hang up -- and that
it is really the path taken."""

from __future__ import annotations

import socket
import time
from typing import Any

import httpx
import orjson
import pytest

from openenv_harness.recorder import RecorderClient, RecorderServer
from openenv_harness.recorder.app import RecorderApp
from openenv_harness.recorder.edge.agent_protocol import AgentCallProtocol, agent_protocol_class
from openenv_harness.testing.engine import EngineServer, Fault, Script, Turn

from agentloop import ADMIN



def _session(recorder: RecorderServer, engine: EngineServer, turns: int = 6) -> dict[str, Any]:
    with RecorderClient(recorder.url, ADMIN) as admin:
        s = admin.create_session()
    engine.set_script(s["session_id"], Script(turns=[Turn(content=f"answer {i}") for i in range(turns)], aux_text=None))
    return s


def _messages(text: str, turn: int) -> list[dict[str, Any]]:
    """A conversation at ``turn`` (the scripted engine counts the assistant messages after the last
    user message), so it answers "answer {turn}"."""
    return [{"role": "user", "content": text}, *({"role": "assistant", "content": f"answer {i}"} for i in range(turn))]


def _chat(s: dict[str, Any], text: str, *, turn: int = 0, extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    body = orjson.dumps({"model": "reference-model", "messages": _messages(text, turn)})
    path = s["base_url"].split("://", 1)[1].split("/", 1)[1]
    return (b"POST /%s/chat/completions HTTP/%s\r\nhost: x\r\nauthorization: Bearer %s\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
            % (path.encode(), version, s["secret"].encode(), len(body), extra, body))


def _read_replies(sock: socket.socket, count: int, timeout_s: float = 20.0) -> list[tuple[int, dict[str, str], bytes]]:
    """``count`` HTTP replies with a content-length, read off a raw socket."""
    sock.settimeout(timeout_s)
    data, replies = b"", []
    while len(replies) < count:
        while b"\r\n\r\n" not in data:
            more = sock.recv(65536)
            if not more:
                raise ConnectionError(f"closed after {len(replies)} replies")
            data += more
        head, data = data.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        if status == 100:
            replies.append((status, headers, b""))
            continue
        length = int(headers["content-length"])
        while len(data) < length:
            more = sock.recv(65536)
            if not more:
                raise ConnectionError("closed mid-body")
            data += more
        replies.append((status, headers, data[:length]))
        data = data[length:]
    return replies


def test_the_recorders_server_answers_chat_calls_without_asgi(
        recorder: RecorderServer, engine: EngineServer, monkeypatch: pytest.MonkeyPatch) -> None:
    assert agent_protocol_class() is AgentCallProtocol, "the installed uvicorn is one this fast path knows"

    async def no_asgi(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a chat call went through the ASGI path")

    monkeypatch.setattr(RecorderApp, "_chat", no_asgi)
    s = _session(recorder, engine)
    with httpx.Client(timeout=30) as client:  # keep-alive: several calls on one connection
        for i in range(3):
            r = client.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                            json={"model": "reference-model", "messages": _messages(f"q{i}", i)})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == f"answer {i}"
            assert r.headers["content-type"] == "application/json" and "date" in r.headers
        bad = client.post(f"{s['base_url']}/chat/completions", headers={"authorization": "Bearer wrong"},
                          json={"messages": [{"role": "user", "content": "x"}]})
        assert bad.status_code == 401 and bad.json()["error"]["type"]
    with RecorderClient(recorder.url, ADMIN) as admin:
        records = admin.records(s["session_id"])
    assert [r["metadata"]["call_index"] for r in records] == [0, 1, 2]


def test_one_write_per_reply(recorder: RecorderServer, engine: EngineServer, monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[bytes] = []
    real = AgentCallProtocol._answer

    async def spy(self: AgentCallProtocol, request: Any, cycle: Any) -> None:
        transport = self.transport
        original = transport.write

        class Counting:
            def __getattr__(self, name: str) -> Any:
                return getattr(transport, name)

            def write(self, data: bytes) -> None:
                writes.append(bytes(data))
                original(data)

        self.transport = Counting()  # type: ignore[assignment]
        try:
            await real(self, request, cycle)
        finally:
            self.transport = transport

    monkeypatch.setattr(AgentCallProtocol, "_answer", spy)
    s = _session(recorder, engine)
    r = httpx.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                   json={"model": "reference-model", "messages": [{"role": "user", "content": "q"}]}, timeout=30)
    assert r.status_code == 200
    assert len(writes) == 1 and writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and writes[0].endswith(r.content)


def test_pipelined_requests_are_answered_in_order(recorder: RecorderServer, engine: EngineServer) -> None:
    s = _session(recorder, engine)
    with socket.create_connection((recorder.host, recorder.port)) as sock:
        # three requests in one write: the second and third arrive while the first is being answered
        sock.sendall(_chat(s, "first") + b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n" + _chat(s, "third", turn=1))
        replies = _read_replies(sock, 3)
    assert [status for status, _, _ in replies] == [200, 200, 200]
    assert orjson.loads(replies[0][2])["choices"][0]["message"]["content"] == "answer 0"
    assert orjson.loads(replies[1][2]) == {"status": "ok"}
    assert orjson.loads(replies[2][2])["choices"][0]["message"]["content"] == "answer 1"


def test_an_oversized_body_gets_413_and_the_connection_stays_usable(small_recorder: RecorderServer,
                                                                      engine: EngineServer) -> None:
    s = _session(small_recorder, engine)
    with socket.create_connection((small_recorder.host, small_recorder.port)) as sock:
        sock.sendall(_chat(s, "x" * 70_000))
        (status, _, body), = _read_replies(sock, 1)
        assert status == 413 and orjson.loads(body)["error"]["code"] == "body_too_large"
        sock.sendall(_chat(s, "small"))
        (status, _, body), = _read_replies(sock, 1)
        assert status == 200 and orjson.loads(body)["choices"][0]["message"]["content"] == "answer 0"
    with RecorderClient(small_recorder.url, ADMIN) as admin:
        assert len(admin.records(s["session_id"])) == 1  # the oversized call never reached the engine


def test_expect_100_continue_and_http_1_0(recorder: RecorderServer, engine: EngineServer) -> None:
    s = _session(recorder, engine)
    request = _chat(s, "waits for continue", extra=b"expect: 100-continue\r\n")
    head, body = request.split(b"\r\n\r\n", 1)
    with socket.create_connection((recorder.host, recorder.port)) as sock:
        sock.sendall(head + b"\r\n\r\n")
        (status, _, _), = _read_replies(sock, 1)
        assert status == 100  # uvicorn's own path answers the expectation
        sock.sendall(body)
        (status, _, reply), = _read_replies(sock, 1)
        assert status == 200 and orjson.loads(reply)["choices"][0]["message"]["content"] == "answer 0"
    with socket.create_connection((recorder.host, recorder.port)) as sock:
        sock.sendall(_chat(s, "old client", turn=1, version=b"1.0"))
        (status, headers, reply), = _read_replies(sock, 1)
        assert status == 200 and headers.get("connection") == "close"
        assert orjson.loads(reply)["choices"][0]["message"]["content"] == "answer 1"
        sock.settimeout(10)
        assert sock.recv(1) == b"", "HTTP/1.0 without keep-alive: the recorder closes the connection"


def test_an_agent_that_hangs_up_mid_call_is_still_recorded(recorder: RecorderServer, engine: EngineServer) -> None:
    with RecorderClient(recorder.url, ADMIN) as admin:
        s = admin.create_session()
        # the engine takes a while: the agent is gone before it answers
        engine.set_script(s["session_id"], Script(turns=[Turn(content="slow", fault=Fault(latency_s=0.5))],
                                                  aux_text=None))
        with socket.create_connection((recorder.host, recorder.port)) as sock:
            sock.sendall(_chat(s, "then hang up"))
            time.sleep(0.1)
        deadline = time.monotonic() + 10
        while not admin.records(s["session_id"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        records = admin.records(s["session_id"])
    assert len(records) == 1 and records[0]["metadata"]["status"] == "ok"
    assert httpx.get(f"{recorder.url}/healthz", timeout=10).status_code == 200  # and the server is fine
