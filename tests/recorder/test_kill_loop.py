"""Kills at random moments, in a bounded loop: SIGKILL the recorder or its index process while
agents call, again and again; every acknowledged call survives, once, in order.

The moments are drawn from a seeded generator (a different moment of each round's traffic each
time); nothing asserted depends on when they fall. A store that gives up after repeated index
process deaths is brought back in place (``POST /admin/store/recover``), as an operator would.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from openenv_harness.recorder import RecorderClient
from openenv_harness.recorder.serving import free_port
from openenv_harness.testing.engine import EngineServer
from openenv_harness.testing.recorder_process import child_pids

from agentloop import ADMIN, TOOLS
from test_durability import _sessions, _until, start_recorder

#: what each round kills, in an order the seed draws: a recorder start is the slow part of a round
KILLS = ["recorder"] * 2 + ["index process"] * 4


class _RoundAgents:
    """One conversation per session for this round; ``acked`` gets ``(round, history length)`` of
    every call answered 200. An agent stops at its first error (it never resends a call)."""

    def __init__(self, sessions: list[dict], round_no: int, acked: dict[str, list[tuple[int, int]]]) -> None:
        self.round, self.acked, self.refused = round_no, acked, Counter()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(s,)) for s in sessions]
        for t in self.threads:
            t.start()

    def count(self) -> int:
        return sum(1 for v in self.acked.values() for r, _ in v if r == self.round)

    def _run(self, s: dict) -> None:
        messages = [{"role": "user", "content": f"go r{self.round}"}]
        with httpx.Client(timeout=20) as client:
            while not self.stop.is_set():
                try:
                    r = client.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                                    json={"model": "reference-model", "messages": messages, "tools": TOOLS})
                except httpx.HTTPError:
                    self.refused["connection"] += 1
                    return
                if r.status_code != 200:
                    self.refused[str(r.status_code)] += 1
                    return
                self.acked[s["session_id"]].append((self.round, len(messages)))
                msg = r.json()["choices"][0]["message"]
                messages = messages + [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "ok"}]

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def _index_process(proc) -> int | None:
    pids = child_pids(proc.pid)
    return pids[0] if len(pids) == 1 else None


@pytest.mark.slow  # rounds of kills and restarts of a recorder process and its index process (~7 s)
def test_kills_at_random_moments_lose_no_acknowledged_call(tmp_path: Path, engine: EngineServer) -> None:
    rng = random.Random(15)
    store, port = tmp_path / "records.db", free_port()
    base = f"http://127.0.0.1:{port}"
    admin_headers = {"authorization": f"Bearer {ADMIN}"}
    proc = start_recorder(store, engine.url, port)
    counts: Counter[str] = Counter()
    try:
        sessions = _sessions(base, engine, 3)
        acked: dict[str, list[tuple[int, int]]] = {s["session_id"]: [] for s in sessions}
        kills = list(KILLS)
        rng.shuffle(kills)
        for round_no, target in enumerate(kills):
            agents = _RoundAgents(sessions, round_no, acked)
            _until(lambda: agents.count() >= 1 or agents.refused, "a call in this round")
            time.sleep(rng.uniform(0.0, 0.6))  # a random moment of the round's traffic
            if target == "recorder":
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                agents.finish()
                counts["recorder killed"] += 1
                proc = start_recorder(store, engine.url, port)
            else:
                child = _until(lambda: _index_process(proc), "the index process")
                os.kill(child, signal.SIGKILL)
                counts["index process killed"] += 1

                def settled() -> str | None:  # replaced, or the store gave up (it died too often)
                    if httpx.get(base + "/healthz").status_code == 503:
                        return "failed"
                    return "replaced" if _index_process(proc) not in (None, child) else None

                if _until(settled, "the index process replaced, or the store failed") == "failed":
                    agents.finish()
                    assert httpx.post(base + "/admin/store/recover", headers=admin_headers).json()["recovered"]
                    counts["store recovered in place"] += 1
                else:
                    before = agents.count()
                    _until(lambda: agents.count() >= before + 3 or agents.refused, "calls after the kill")
                    agents.finish()
            counts.update({f"refused ({k})": v for k, v in agents.refused.items()})
        with RecorderClient(base, ADMIN) as admin:
            for s in sessions:
                records = admin.records(s["session_id"])
                keys = [(int(r["request"]["messages"][0]["content"][len("go r"):]), len(r["request"]["messages"]))
                        for r in records]
                assert len(set(keys)) == len(keys), "a call recorded twice"
                position = {key: i for i, key in enumerate(keys)}
                mine = acked[s["session_id"]]
                assert all(key in position for key in mine), "an acknowledged call was lost"
                assert [position[key] for key in mine] == sorted(position[key] for key in mine), "out of order"
                indexes = [r["metadata"]["call_index"] for r in records]
                assert indexes == sorted(set(indexes))
                assert {r["metadata"]["status"] for r in records} == {"ok"}
                counts["acknowledged calls"] += len(mine)
                counts["records"] += len(records)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print("\nkill loop:", dict(counts))
    assert counts["acknowledged calls"] >= len(KILLS)
