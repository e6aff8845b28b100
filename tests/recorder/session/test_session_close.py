"""Closing a session with a call in flight: the close waits for it (bounded), cancels what is left
and records it as cancelled, and from then on the session's records -- its training trace -- never change."""

from __future__ import annotations

import threading
import time
from array import array
from pathlib import Path

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.store.base import PendingRecord, SessionSealed
from openenv_harness.recorder.store.sqlite import SQLiteStore
from openenv_harness.testing.engine import EngineServer, Fault

from agentloop import ADMIN, TOOLS, tool_script


def _post(s: dict, messages: list[dict]) -> httpx.Response:
    return httpx.post(f"{s['base_url']}/chat/completions", timeout=60, headers={"authorization": f"Bearer {s['secret']}"},
                      json={"model": "reference-model", "messages": messages, "tools": TOOLS})


def _second_turn(s: dict) -> list[dict]:
    """The first call of a chain, answered; returns the messages of the call that extends it."""
    first = [{"role": "user", "content": "go"}]
    reply = _post(s, first)
    assert reply.status_code == 200, reply.text
    msg = reply.json()["choices"][0]["message"]
    return first + [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "ok"}]


def _in_flight(server: RecorderServer, s: dict, messages: list[dict]) -> tuple[threading.Thread, dict]:
    """Send a call in the background and return once it is at the engine."""
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("reply", _post(s, messages)))
    thread.start()
    deadline = time.monotonic() + 30
    while server.ctx.fence.inflight == 0:
        assert time.monotonic() < deadline and thread.is_alive(), "the call never reached the engine"
        time.sleep(0.01)
    return thread, out


@pytest.fixture
def stack(tmp_path: Path):
    engine = EngineServer().start()
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN)
    server = RecorderServer(config).start()
    admin = RecorderClient(server.url, ADMIN)
    yield engine, server, admin
    admin.close()
    server.stop()
    engine.stop()


def test_close_waits_for_a_call_in_flight_and_the_trace_is_final_when_it_returns(stack) -> None:
    engine, server, admin = stack
    s = admin.create_session()
    sid = s["session_id"]
    engine.set_script(sid, tool_script(3))
    messages = _second_turn(s)
    engine.add_fault(sid, Fault(latency_s=1.0, on_turn=1))
    thread, out = _in_flight(server, s, messages)
    closed = admin.close_session(sid, grace_s=60)
    assert closed["status"] == "closed"
    trace_at_close = admin.training_trace_json(sid)
    records = admin.records(sid)
    # the call finished within the grace and was recorded before the close returned, against its chain
    assert [r["metadata"]["status"] for r in records] == ["ok", "ok"]
    assert records[1]["metadata"]["fidelity"]["class"] != "root"  # classified against the first call
    assert len(trace_at_close["turns"]) == 2 and trace_at_close == admin.training_trace_json(sid)
    thread.join(30)
    assert out["reply"].status_code == 200
    assert admin.training_trace_json(sid) == trace_at_close and admin.records(sid) == records
    assert _post(s, messages + [{"role": "user", "content": "more"}]).status_code == 409


def test_a_call_still_at_the_engine_after_the_grace_is_cancelled_and_recorded_untrainable(stack) -> None:
    engine, server, admin = stack
    s = admin.create_session()
    sid = s["session_id"]
    engine.set_script(sid, tool_script(3))
    messages = _second_turn(s)
    engine.add_fault(sid, Fault(latency_s=30.0, on_turn=1))
    thread, out = _in_flight(server, s, messages)
    admin.close_session(sid, grace_s=0)
    records = admin.records(sid)
    assert [r["metadata"]["status"] for r in records] == ["ok", "failed"]
    cancelled = records[1]["metadata"]
    assert cancelled["error"]["kind"] == "cancelled" and cancelled["trainable"] is False
    assert cancelled["call_index"] == 1 and records[1]["completion_token_ids"] == []
    thread.join(30)
    reply = out["reply"]
    assert reply.status_code == 409 and reply.json()["error"]["code"] == "session_closed"
    trace = admin.training_trace_json(sid)
    assert admin.records(sid) == records and admin.training_trace_json(sid) == trace
    info = admin.session(sid)
    assert info["status"] == "closed" and info["failed_calls"] == 1
    assert info["last_error"] is None  # no engine failed it: a rollout is not unscored for it


def test_a_call_held_at_a_paused_fence_is_refused_unrecorded_by_the_close(stack) -> None:
    engine, server, admin = stack
    s = admin.create_session()
    sid = s["session_id"]
    engine.set_script(sid, tool_script(3))
    admin.pause_engine("keep")
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("reply", _post(s, [{"role": "user", "content": "held"}])))
    thread.start()
    live = server.ctx.sessions.get(sid)
    deadline = time.monotonic() + 30
    while not live.calls:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    admin.close_session(sid, grace_s=0)
    thread.join(30)
    assert out["reply"].status_code == 409 and admin.records(sid) == []
    admin.resume_engine()


async def test_a_sealed_store_refuses_appends_for_the_session_only(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "r.db")
    store.open()

    def record(session_id: str) -> PendingRecord:
        return PendingRecord(session_id=session_id, call_index=0, call_kind="agent", status="ok",
                             request={"messages": [{"role": "user", "content": "x"}]}, response={},
                             prompt_ids=array("I", [1, 2]), completion_ids=array("I", [3]),
                             logprobs=array("d", [-0.1]), completion_tokens=None, trainable=True,
                             metadata={"request_digest": "d"}, created_at=time.time())

    try:
        await store.append(record("a"))
        store.seal("a")
        with pytest.raises(SessionSealed):
            await store.append(record("a"))
        await store.append(record("b"))
        assert len(await store.read_records("a")) == 1 and len(await store.read_records("b")) == 1
    finally:
        store.close()
