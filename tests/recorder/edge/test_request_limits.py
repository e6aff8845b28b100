"""Request heads and bodies are bounded before anything else happens, on every route and on both
protocol paths (``edge/agent_protocol.py`` and the ASGI app): header bytes and count (431), a declared
body over the limit (413 at once), and the time a connection has to send its head and its body
(408, then the connection is closed). All over raw sockets, since no HTTP client sends these."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import httpx
import orjson
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.app import create_recorder_app
from openenv_harness.recorder.serving import ThreadedServer
from openenv_harness.testing.engine import EngineServer

from agentloop import ADMIN, tool_script
from rawhttp import exchange, request

LIMITS: dict[str, Any] = {"max_header_bytes": 8192, "max_header_count": 32, "max_body_bytes": 64 * 1024}


def _config(tmp_path: Path, engine: EngineServer, **extra: Any) -> RecorderConfig:
    return RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN, **extra)


@pytest.fixture
def limited(tmp_path: Path, engine: EngineServer) -> Iterator[RecorderServer]:
    """Small head limits; timeouts long enough never to matter here."""
    with RecorderServer(_config(tmp_path, engine, **LIMITS)) as server:
        yield server


@pytest.fixture
def impatient(tmp_path: Path, engine: EngineServer) -> Iterator[RecorderServer]:
    """Default size limits; two seconds to send a head or a body (ample for any client that means to)."""
    config = _config(tmp_path, engine, request_head_timeout_s=2.0, request_body_timeout_s=2.0)
    with RecorderServer(config) as server:
        yield server


@pytest.fixture(params=["httptools", "h11"])
def asgi_only(request: pytest.FixtureRequest, tmp_path: Path, engine: EngineServer) -> Iterator[ThreadedServer]:
    """The recorder app under uvicorn's own protocols: every request takes the ASGI path."""
    app = create_recorder_app(_config(tmp_path, engine, **LIMITS))
    with ThreadedServer(app, http=request.param) as server:
        yield server


def _session(server: Any, engine: EngineServer) -> dict[str, Any]:
    with RecorderClient(server.url, ADMIN) as admin:
        s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(0, final="ok"))
    return s


def _chat_path(s: dict[str, Any]) -> str:
    return "/" + s["base_url"].split("://", 1)[1].split("/", 1)[1] + "/chat/completions"


def _chat(s: dict[str, Any], headers: list[tuple[str, str]] | None = None, **kwargs: Any) -> bytes:
    body = orjson.dumps({"model": "reference-model", "messages": [{"role": "user", "content": "hi"}]})
    return request("POST", _chat_path(s), [("authorization", f"Bearer {s['secret']}"),
                                           ("content-type", "application/json"), *(headers or [])],
                   kwargs.pop("body", body), **kwargs)


def _routes(s: dict[str, Any]) -> list[tuple[str, str, list[tuple[str, str]], bytes]]:
    """One request per kind of route: liveness, agent chat, models, admin, viewer page."""
    agent = [("authorization", f"Bearer {s['secret']}")]
    return [("GET", "/healthz", [], b""),
            ("POST", _chat_path(s), agent, b'{"messages":[{"role":"user","content":"hi"}]}'),
            ("GET", _chat_path(s).replace("chat/completions", "models"), agent, b""),
            ("GET", "/admin/health", [("authorization", f"Bearer {ADMIN}")], b""),
            ("GET", "/viewer/", [], b"")]


def _healthy(server: Any, s: dict[str, Any]) -> None:
    assert httpx.get(server.url + "/healthz", timeout=30).status_code == 200
    r = httpx.post(server.url + _chat_path(s), timeout=30, headers={"authorization": f"Bearer {s['secret']}"},
                   json={"model": "reference-model", "messages": [{"role": "user", "content": "still fine?"}]})
    assert r.status_code == 200, r.text


def test_oversized_heads_get_431_on_every_route(limited: RecorderServer, engine: EngineServer) -> None:
    s = _session(limited, engine)
    for method, path, headers, body in _routes(s):
        big = request(method, path, [*headers, ("x-filler", "a" * 1024 * 1024)], body)
        out = exchange(limited.host, limited.port, big, until_closed=True)
        assert out.status == 431 and out.closed, (path, out)
        error = orjson.loads(out.replies[0].body)["error"]
        assert error["code"] == "header_too_large" and "8192 bytes" in error["message"]
        # the same head sent a piece at a time is refused once it passes the limit
        pieces = [big[:100]] + [b"x-more: " + b"b" * 4000 + b"\r\n"] * 64
        out = exchange(limited.host, limited.port, pieces, until_closed=True)
        assert out.status == 431 and out.closed, (path, out)
        # a head just under the limit is served as usual
        fits = request(method, path, [*headers, ("x-filler", "a" * 6000)], body)
        assert exchange(limited.host, limited.port, fits).status not in (431, None), path
    _healthy(limited, s)
    with RecorderClient(limited.url, ADMIN) as admin:
        assert len(admin.records(s["session_id"])) == 2  # the two chat calls that fit, and the health check's


def test_a_long_request_line_is_bounded_too(limited: RecorderServer, engine: EngineServer) -> None:
    s = _session(limited, engine)
    out = exchange(limited.host, limited.port, request("GET", "/healthz?" + "q" * 20_000), until_closed=True)
    assert out.status == 431 and out.closed
    _healthy(limited, s)


def test_too_many_header_fields_get_431(limited: RecorderServer, engine: EngineServer) -> None:
    s = _session(limited, engine)
    for method, path, headers, body in _routes(s):
        many = [*headers, *((f"x-h{i}", "v") for i in range(40))]
        out = exchange(limited.host, limited.port, request(method, path, many, body), until_closed=True)
        assert out.status == 431 and out.closed, (path, out)
        assert "32 header fields" in orjson.loads(out.replies[0].body)["error"]["message"]
        few = [*headers, *((f"x-h{i}", "v") for i in range(20))]
        assert exchange(limited.host, limited.port, request(method, path, few, body)).status != 431
    _healthy(limited, s)


def test_an_oversized_head_pipelined_behind_a_call_is_refused_after_its_reply(
        limited: RecorderServer, engine: EngineServer) -> None:
    s = _session(limited, engine)
    big = request("GET", "/healthz", [("x-filler", "a" * 100_000)])
    out = exchange(limited.host, limited.port, _chat(s) + big, replies=2, until_closed=True)
    assert out.statuses == [200, 431] and out.closed
    assert orjson.loads(out.replies[0].body)["choices"][0]["message"]["content"]


def test_a_huge_declared_body_gets_413_at_once(limited: RecorderServer, engine: EngineServer) -> None:
    """The head says 1 TB, the body is two bytes: answered at once (the body timeout here is two
    minutes, and this read waits thirty seconds at most)."""
    s = _session(limited, engine)
    out = exchange(limited.host, limited.port, _chat(s, body=b"{}", content_length=10**12))
    assert out.status == 413 and orjson.loads(out.replies[0].body)["error"]["code"] == "body_too_large"
    _healthy(limited, s)
    with RecorderClient(limited.url, ADMIN) as admin:
        assert len(admin.records(s["session_id"])) == 1


@pytest.mark.slow  # four connections each left to the header timeout (~8.5 s)
def test_a_head_that_never_ends_gets_408_and_is_closed(impatient: RecorderServer, engine: EngineServer) -> None:
    s = _session(impatient, engine)
    for partial in (b"GET /healthz HTTP/1.1\r\nhost: x\r\n", _chat(s).split(b"\r\n\r\n")[0],  b"P"):
        out = exchange(impatient.host, impatient.port, partial, until_closed=True)
        assert out.status == 408 and out.closed, (partial[:30], out)
        assert orjson.loads(out.replies[0].body)["error"]["code"] == "request_timeout"
    # a connection that never sends a byte is closed without a word
    out = exchange(impatient.host, impatient.port, b"", until_closed=True)
    assert out.closed and out.replies == [] and out.leftover == b""
    _healthy(impatient, s)


def test_a_body_that_never_ends_gets_408_and_is_closed(impatient: RecorderServer, engine: EngineServer) -> None:
    s = _session(impatient, engine)
    admin_post = request("POST", "/admin/sessions", [("authorization", f"Bearer {ADMIN}"),
                                                     ("content-type", "application/json")],
                         b'{"metadata":', content_length=100)
    for partial in (_chat(s, body=b'{"messages":', content_length=100), admin_post):
        out = exchange(impatient.host, impatient.port, partial, until_closed=True)
        assert out.status == 408 and out.closed, (partial[:30], out)
    _healthy(impatient, s)
    with RecorderClient(impatient.url, ADMIN) as admin:
        assert len(admin.records(s["session_id"])) == 1  # the health check's call only
        assert len(admin.sessions()) == 1  # the cut-off admin request created nothing


def test_the_asgi_path_bounds_heads_too(asgi_only: ThreadedServer, engine: EngineServer) -> None:
    """Under uvicorn's own protocols the app refuses what reaches it; what is too big to reach it is
    refused by the server (h11 answers 400 past its buffer, sized to the same limit)."""
    s = _session(asgi_only, engine)
    for method, path, headers, body in _routes(s):
        many = [*headers, *((f"x-h{i}", "v") for i in range(40))]
        out = exchange(asgi_only.host, asgi_only.port, request(method, path, many, body))
        assert out.status == 431, (path, out)
        big = request(method, path, [*headers, ("x-filler", "a" * 1024 * 1024)], body)
        out = exchange(asgi_only.host, asgi_only.port, big, until_closed=True)
        assert out.status in (400, 431) and out.closed, (path, out)
    out = exchange(asgi_only.host, asgi_only.port, _chat(s, body=b"{}", content_length=10**12))
    assert out.status == 413
    _healthy(asgi_only, s)
