"""The admin listener (``RecorderConfig.admin_port``): session create, read and close on a port of
their own, with the main port's auth and answers; a close with a call in flight still waits for it
or cancels it on the chat loop; creates through both ports never collide; the client finds it."""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.client import forget_admin_listeners
from openenv_harness.recorder.session.live import LiveSession
from openenv_harness.testing.engine import EngineServer, Fault

from agentloop import ADMIN, tool_script
from test_session_close import _in_flight, _post, _second_turn


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[EngineServer, RecorderServer]]:
    forget_admin_listeners()
    engine = EngineServer().start()
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN, admin_port=0)
    server = RecorderServer(config).start()
    yield engine, server
    server.stop()
    engine.stop()
    forget_admin_listeners()


class _Seen(httpx.HTTPTransport):
    """A real transport that notes the port of every request it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.ports: list[tuple[str, int | None]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.ports.append((request.url.path, request.url.port))
        return super().handle_request(request)


def _bearer(token: str | None) -> dict[str, str]:
    return {} if token is None else {"authorization": f"Bearer {token}"}


def test_create_read_and_close_through_the_listener(stack: Any) -> None:
    engine, server = stack
    assert server.admin_url is not None and server.admin_url != server.url
    with RecorderClient(server.url, ADMIN, admin_url=server.admin_url) as admin:
        s = admin.create_session(metadata={"n": 1})
        assert s["base_url"] == f"{server.url}/rollout/{s['session_id']}/v1"  # the main port, not the listener's
        engine.set_script(s["session_id"], tool_script(2))
        assert _post(s, [{"role": "user", "content": "go"}]).status_code == 200
        assert admin.session(s["session_id"])["calls"] == 1
        closed = admin.close_session(s["session_id"])
        assert closed["status"] == "closed" and closed["calls"] == 1
        assert [r["metadata"]["status"] for r in admin.records(s["session_id"])] == ["ok"]
        assert _post(s, [{"role": "user", "content": "again"}]).status_code == 409
    # the main port sees the same session, closed, and answers as it always did
    with RecorderClient(server.url, ADMIN, discover_admin=False) as main:
        assert main.session(s["session_id"])["status"] == "closed"
        other = main.create_session()
        assert main.close_session(other["session_id"])["status"] == "closed"
        assert main.health()["admin_listener"]["admin_url"] == server.admin_url
    with RecorderClient(server.url, ADMIN, admin_url=server.admin_url) as admin:  # health, as a factory asks it
        health = admin.health()
        assert health["status"] == "ok" and health["sessions"] == {"closed": 2}
        assert health["store"]["failure"] is None and health["admin_listener"]["admin_url"] == server.admin_url


def test_the_listener_asks_for_the_same_token_and_answers_alike(stack: Any) -> None:
    _, server = stack
    for token in (None, "wrong-token-0123456789abcdef", "Basic x"):
        answers = []
        for root in (server.url, server.admin_url):
            r = httpx.post(f"{root}/admin/sessions", json={}, headers=_bearer(token), timeout=30)
            c = httpx.post(f"{root}/admin/sessions/nope/close", headers=_bearer(token), timeout=30)
            answers.append((r.status_code, r.json(), c.status_code, c.json()))
        assert answers[0] == answers[1] and answers[0][0] == 401 and answers[0][2] == 401
    assert server.ctx.sessions.all() == []
    # a bad body and an unknown session: the same errors on both ports
    for path, body in (("/admin/sessions", {"budgets": {"max_calls": -1}}), ("/admin/sessions/nope/close", None)):
        got = [httpx.post(root + path, json=body, headers=_bearer(ADMIN), timeout=30) for root in (server.url, server.admin_url)]
        assert got[0].status_code == got[1].status_code >= 400 and got[0].json() == got[1].json()


def test_the_listener_serves_only_session_lifecycle(stack: Any) -> None:
    _, server = stack
    huge = {"authorization": f"Bearer {ADMIN}", "x-pad": "p" * (server.config.max_header_bytes + 1)}
    answers = [httpx.post(f"{root}/admin/sessions", json={}, headers=huge, timeout=30) for root in (server.url, server.admin_url)]
    assert [a.status_code for a in answers] == [431, 431] and server.ctx.sessions.all() == []
    r = httpx.post(f"{server.admin_url}/admin/engine/pause", headers=_bearer(ADMIN), timeout=30)
    assert r.status_code == 404 and "main port" in r.json()["error"]["message"]
    assert not server.ctx.fence.state()["paused"]


def _call_in_flight(engine: Any, server: Any, admin: RecorderClient, latency_s: float) -> tuple[str, Any, dict]:
    """A session whose second call waits ``latency_s`` at the engine: (its id, the caller's thread, its reply)."""
    s = admin.create_session()
    sid = s["session_id"]
    engine.set_script(sid, tool_script(3))
    messages = _second_turn(s)
    engine.add_fault(sid, Fault(latency_s=latency_s, on_turn=1))
    thread, out = _in_flight(server, s, messages)
    return sid, thread, out


def test_a_close_through_the_listener_waits_for_a_call_in_flight(stack: Any) -> None:
    engine, server = stack
    with RecorderClient(server.url, ADMIN, admin_url=server.admin_url) as admin:
        sid, thread, out = _call_in_flight(engine, server, admin, 1.0)
        assert admin.close_session(sid, grace_s=60)["status"] == "closed"
        records = admin.records(sid)
        assert [r["metadata"]["status"] for r in records] == ["ok", "ok"]  # recorded before the close answered
        thread.join(30)
        assert out["reply"].status_code == 200 and admin.records(sid) == records


def test_a_close_through_the_listener_cancels_a_call_past_the_grace(stack: Any) -> None:
    engine, server = stack
    with RecorderClient(server.url, ADMIN, admin_url=server.admin_url) as admin:
        sid, thread, out = _call_in_flight(engine, server, admin, 30.0)
        admin.close_session(sid, grace_s=0)
        records = admin.records(sid)
        assert [r["metadata"]["status"] for r in records] == ["ok", "failed"]
        assert records[1]["metadata"]["error"]["kind"] == "cancelled"
        thread.join(30)
        assert out["reply"].status_code == 409 and out["reply"].json()["error"]["code"] == "session_closed"
        # a second close, from either port, answers at once with the same final state
        assert admin.close_session(sid)["status"] == "closed"
        with RecorderClient(server.url, ADMIN, discover_admin=False) as main:
            assert main.close_session(sid)["failed_calls"] == 1


def test_a_call_registered_while_the_listener_closes_its_session_is_refused(stack: Any,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The interleaving across the two threads: the call passed authentication, then the close began
    on the listener's thread and saw no call in flight, then the call registered itself. The close
    must finish while the chat loop is held (it needs nothing from that loop), and the call is refused
    unrecorded (``handle_chat`` checks ``closing`` again once the call is registered, and the flow
    once more before the engine)."""
    engine, server = stack
    with RecorderClient(server.url, ADMIN, admin_url=server.admin_url) as admin:
        s = admin.create_session()
        sid = s["session_id"]
        engine.set_script(sid, tool_script(2))
        original = LiveSession.call_started
        closed: dict[str, Any] = {}

        def close_first(self: LiveSession, flow: Any) -> None:
            if self.id == sid and not closed:
                worker = threading.Thread(target=lambda: closed.setdefault("answer", admin.close_session(sid)))
                worker.start()
                worker.join(30)  # the chat loop is held here: the close must not need it to answer
            original(self, flow)

        monkeypatch.setattr(LiveSession, "call_started", close_first)
        reply = _post(s, [{"role": "user", "content": "go"}])
        assert closed["answer"]["status"] == "closed" and closed["answer"]["calls"] == 0
        assert reply.status_code == 409 and reply.json()["error"]["code"] == "session_closed"
        assert admin.records(sid) == [] and server.ctx.sessions.get(sid).calls == {}


def test_creates_through_both_ports_never_collide(stack: Any, tmp_path: Path) -> None:
    _, server = stack
    roots = [server.url, server.admin_url]

    def create(i: int) -> tuple[str, int, dict]:
        r = httpx.post(f"{roots[i % 2]}/admin/sessions", headers=_bearer(ADMIN), timeout=60,
                       json={"session_id": f"dup-{i // 2}"} if i < 80 else {"metadata": {"i": i}})
        return f"dup-{i // 2}" if i < 80 else "", r.status_code, r.json()

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(create, range(160)))
    by_id: dict[str, list[int]] = {}
    for sid, status, _ in results[:80]:
        by_id.setdefault(sid, []).append(status)
    assert all(sorted(v) == [201, 409] for v in by_id.values()) and len(by_id) == 40
    fresh = [body["session_id"] for _, status, body in results[80:] if status == 201]
    assert len(fresh) == 80 and len(set(fresh)) == 80
    registry = server.ctx.sessions
    live = registry.all()
    assert len(live) == 120 and {x.id for x in live} == set(by_id) | set(fresh)
    assert all(registry.by_digest(x.secret_digest) is x for x in live) and registry._reserved == set()
    # every session is durable: a recorder opened on the same store resumes all of them
    server.stop()
    again = RecorderServer(RecorderConfig(store_path=server.config.store_path, admin_token=ADMIN,
                                          probe_template=False, probe_logprobs_mode=False)).start()
    try:
        assert {x.id for x in again.ctx.sessions.all()} == set(by_id) | set(fresh)
    finally:
        again.stop()
        server.start()


def test_the_client_finds_the_listener_and_falls_back_to_the_main_port(stack: Any) -> None:
    _, server = stack
    seen = _Seen()
    with RecorderClient(server.url, ADMIN, transport=seen) as admin:
        s = admin.create_session()
        admin.session(s["session_id"])
        admin.close_session(s["session_id"])
        admin.health()
        admin.records(s["session_id"])
    listener, main = server.ctx.admin_listener.port, server.port
    assert seen.ports == [("/admin/listener", main), ("/admin/sessions", listener),
                          (f"/admin/sessions/{s['session_id']}", listener),
                          (f"/admin/sessions/{s['session_id']}/close", listener),
                          ("/admin/health", listener), (f"/admin/sessions/{s['session_id']}/records", main)]
    seen.ports.clear()
    with RecorderClient(server.url, ADMIN, transport=seen) as admin:  # learned once per process
        admin.create_session()
    assert seen.ports == [("/admin/sessions", listener)]
    # a listener that is gone: the main port serves the call, and later clients ask again
    seen.ports.clear()
    server.ctx.admin_listener.stop()
    with RecorderClient(server.url, ADMIN, transport=seen) as admin:
        assert admin.create_session()["session_id"]
    assert seen.ports == [("/admin/sessions", listener), ("/admin/sessions", main)]


def test_without_an_admin_port_the_client_uses_the_main_port(tmp_path: Path, engine: EngineServer) -> None:
    forget_admin_listeners()
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN)
    seen = _Seen()
    with RecorderServer(config) as server, RecorderClient(server.url, ADMIN, transport=seen) as admin:
        assert server.admin_url is None
        assert admin.create_session()["session_id"]
        assert seen.ports == [("/admin/listener", server.port), ("/admin/sessions", server.port)]
    forget_admin_listeners()


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are Linux's")
def test_the_listener_thread_runs_at_its_own_priority(tmp_path: Path, engine: EngineServer) -> None:
    """Lowering a thread's priority is always allowed, so +5 shows the setting reaches the thread."""
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN,
                            admin_port=0, admin_nice=5)
    with RecorderServer(config) as server:
        listener = server.ctx.admin_listener
        tid = listener._server._thread.native_id
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert listener.nice == min(19, own + 5) == os.getpriority(os.PRIO_PROCESS, tid)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own  # only that thread moved
