"""Records are durable before the reply (D14): SIGKILL the recorder mid-session, restart, lose nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderServer
from openenv_harness.recorder.serving import free_port
from openenv_harness.recorder.store.journal import JournalError
from openenv_harness.testing.engine import EngineServer
from openenv_harness.testing.recorder_process import child_pids, start_recorder_process

from agentloop import ADMIN, TOOLS, tool_script


def start_recorder(store: Path, engine_url: str, port: int, *extra: str) -> subprocess.Popen:
    return start_recorder_process(store, engine_url, port, ADMIN, *extra)


class Agents:
    """Agents calling back to back on their sessions; ``acked`` holds the history length of every
    call that got a 200, ``refused`` every other status. A dropped connection ends an agent."""

    def __init__(self, sessions: list[dict]) -> None:
        self.acked: dict[str, list[int]] = {s["session_id"]: [] for s in sessions}
        self.refused: list[int] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(s,)) for s in sessions]
        for t in self.threads:
            t.start()

    def _run(self, s: dict) -> None:
        messages = [{"role": "user", "content": "go"}]
        client = httpx.Client(timeout=10)
        while not self.stop.is_set():
            try:
                r = client.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                                json={"model": "reference-model", "messages": messages, "tools": TOOLS})
            except httpx.HTTPError:
                return  # the recorder died under us: this call was never acknowledged
            if r.status_code != 200:
                self.refused.append(r.status_code)
                return
            self.acked[s["session_id"]].append(len(messages))
            msg = r.json()["choices"][0]["message"]
            messages = messages + [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "ok"}]

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def _sessions(base: str, engine: EngineServer, count: int) -> list[dict]:
    admin = {"authorization": f"Bearer {ADMIN}"}
    sessions = [httpx.post(base + "/admin/sessions", json={}, headers=admin).json() for _ in range(count)]
    for s in sessions:
        engine.set_script(s["session_id"], tool_script(200))
    return sessions


@pytest.mark.slow  # agents run 2.5 s before the kill, then a restart (~9 s)
def test_sigkill_mid_session_loses_no_acknowledged_call(tmp_path: Path, engine: EngineServer) -> None:
    store = tmp_path / "records.db"
    port = free_port()
    admin = {"authorization": f"Bearer {ADMIN}"}
    proc = start_recorder(store, engine.url, port)
    base = f"http://127.0.0.1:{port}"
    sessions = _sessions(base, engine, 4)
    agents = Agents(sessions)
    time.sleep(2.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    agents.finish()
    acked = agents.acked
    assert sum(len(v) for v in acked.values()) >= 8, acked

    proc = start_recorder(store, engine.url, port)
    try:
        for s in sessions:
            records = httpx.get(f"{base}/admin/sessions/{s['session_id']}/records", headers=admin).json()
            ok = [r for r in records if r["metadata"]["status"] == "ok"]
            # every acknowledged call is there, in order (the call in flight at the kill may be too)
            assert len(ok) >= len(acked[s["session_id"]])
            assert [len(r["request"]["messages"]) for r in ok][: len(acked[s["session_id"]])] == acked[s["session_id"]]
            # the session goes on working with the same secret, and numbering continues
            r = httpx.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                           json={"model": "reference-model", "messages": [{"role": "user", "content": "again"}],
                                 "tools": TOOLS})
            assert r.status_code == 200, r.text
            after = httpx.get(f"{base}/admin/sessions/{s['session_id']}/records", headers=admin).json()
            info = httpx.get(f"{base}/admin/sessions/{s['session_id']}", headers=admin).json()
            assert info["agent_calls"] == len(ok) + 1  # budgets keep counting across the restart
            indexes = [x["metadata"]["call_index"] for x in after]
            assert indexes == sorted(set(indexes)) and len(after) == len(records) + 1
            # the chain tips came back from the records: a new history is a break, not the session's root
            assert after[-1]["metadata"]["fidelity"]["class"] == "break"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _until(condition, what: str, timeout_s: float = 60.0):
    """Wait for ``condition()`` to be truthy and return it; the bound only keeps a broken run from
    hanging -- nothing here depends on how fast it gets there."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)
    return value


def test_a_killed_index_process_costs_agents_nothing(tmp_path: Path, engine: EngineServer) -> None:
    """SIGKILL the recorder's index process while agents run: no call fails, every one is recorded once,
    and its replacement runs at the priority the recorder was started with -- for ``idle``: started
    as ``idle``, and back under SCHED_IDLE whenever it has caught up (while it is behind or someone
    waits, the recorder raises it, so what it runs at *during* the calls is not the rule)."""
    store = tmp_path / "records.db"
    port = free_port()
    proc = start_recorder(store, engine.url, port, "--index-priority", "idle")
    base = f"http://127.0.0.1:{port}"

    def children() -> list[int]:
        return child_pids(proc.pid)

    def priority_arg(pid: int) -> str:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[-2].decode()

    def idle(pid: int) -> bool:
        return os.sched_getscheduler(pid) == os.SCHED_IDLE

    def acked(agents: Agents) -> int:
        return sum(len(v) for v in agents.acked.values())

    try:
        (child,) = _until(children, "the index process")
        assert priority_arg(child) == "idle" and _until(lambda: idle(child), "the index process at idle priority")
        sessions = _sessions(base, engine, 4)
        agents = Agents(sessions)
        _until(lambda: acked(agents) >= 8 or agents.refused, "calls before the kill")
        os.kill(child, signal.SIGKILL)
        (replacement,) = _until(lambda: [p for p in children() if p != child], "the replacement index process")
        before = acked(agents)
        _until(lambda: acked(agents) >= before + 8 or agents.refused, "calls after the kill")
        agents.finish()
        assert agents.refused == [], agents.refused
        assert priority_arg(replacement) == "idle"
        assert _until(lambda: idle(replacement), "the replacement back at idle priority once caught up")
        with RecorderClient(base, ADMIN) as admin:
            for s in sessions:
                records = admin.records(s["session_id"])
                assert [len(r["request"]["messages"]) for r in records] == agents.acked[s["session_id"]]
                assert [r["metadata"]["call_index"] for r in records] == list(range(len(records)))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_call_whose_record_cannot_be_stored_is_a_retryable_error(
    recorder: RecorderServer, admin: RecorderClient, engine: EngineServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(3))
    journal = recorder.ctx.store.journal
    real_append = journal.append

    def disk_full(seq: int, parts: list[bytes]) -> None:
        raise JournalError("cannot write the record journal: [Errno 28] No space left on device")

    monkeypatch.setattr(journal, "append", disk_full)
    call = {"model": "reference-model", "messages": [{"role": "user", "content": "go"}], "tools": TOOLS}
    headers = {"authorization": f"Bearer {s['secret']}"}
    r = httpx.post(f"{s['base_url']}/chat/completions", json=call, headers=headers, timeout=30)
    assert r.status_code == 503 and r.headers["retry-after"]
    assert r.json()["error"]["code"] == "store_unavailable" and "No space left" in r.json()["error"]["message"]
    assert admin.records(s["session_id"]) == []

    monkeypatch.setattr(journal, "append", real_append)
    r = httpx.post(f"{s['base_url']}/chat/completions", json=call, headers=headers, timeout=30)
    assert r.status_code == 200, "the agent's retry goes through once storage is back"
    assert [rec["metadata"]["status"] for rec in admin.records(s["session_id"])] == ["ok"]
