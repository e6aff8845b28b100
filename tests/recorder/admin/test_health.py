"""Health that tells the truth: a store that cannot take records is unhealthy on every probe, the
metrics say so, and it can be recovered in place without losing an acknowledged call."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.store import indexer as indexer_module
from openenv_harness.testing.engine import EngineServer

from agentloop import ADMIN, TOOLS, tool_script


def _until(condition, what: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.02)
    return value


def _chat(s: dict, text: str) -> httpx.Response:
    return httpx.post(f"{s['base_url']}/chat/completions", timeout=30, headers={"authorization": f"Bearer {s['secret']}"},
                      json={"model": "reference-model", "messages": [{"role": "user", "content": text}], "tools": TOOLS})


def _metric(admin: RecorderClient, name: str) -> float:
    for line in admin.metrics_text().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def test_a_store_whose_index_process_keeps_dying_is_unhealthy_everywhere_and_recovers_in_place(
    tmp_path: Path, engine: EngineServer
) -> None:
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN,
                            store_indexer="process", index_priority="normal")
    with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as admin:
        store = server.ctx.store
        s = admin.create_session()
        engine.set_script(s["session_id"], tool_script(20))
        assert _chat(s, "before").status_code == 200
        assert httpx.get(server.url + "/healthz").status_code == 200
        assert httpx.get(server.url + "/readyz").status_code == 200
        assert admin.health()["status"] == "ok" and _metric(admin, "oeh_store_accepting_records") == 1

        # the index process dies again and again; the last one dies holding records it never indexed
        for death in range(indexer_module.MAX_RESTARTS + 1):
            pid = _until(lambda: store._queue.indexer.pid, "an index process")
            if death == indexer_module.MAX_RESTARTS:
                os.kill(pid, signal.SIGSTOP)
                acked = [_chat(s, f"acked while the index process is stopped {i}") for i in range(2)]
                assert [r.status_code for r in acked] == [200, 200]  # journalled: durable, acknowledged
            os.kill(pid, signal.SIGKILL)
            if death < indexer_module.MAX_RESTARTS:
                _until(lambda: store._queue.indexer.pid not in (None, pid), "the replacement index process")
        _until(lambda: store.failure() is not None, "the store to give up")
        # the failed index process's unacknowledged records are handed back to the store on a thread of
        # their own (``ProcessIndexer._fail``), just after the failure is set: seen late under load
        _until(lambda: store.stats()["journal_unindexed"] >= 2, "the unindexed records to be counted")

        refused = _chat(s, "refused")
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "store_unavailable"
        live = httpx.get(server.url + "/healthz")
        ready = httpx.get(server.url + "/readyz")
        assert live.status_code == ready.status_code == 503
        assert live.json()["status"] == "unavailable" and "died" not in live.text  # no details before auth
        health = httpx.get(server.url + "/admin/health", headers={"authorization": f"Bearer {ADMIN}"})
        assert health.status_code == 503 and health.json()["status"] == "store_unavailable"
        assert "index process died" in health.json()["store"]["failure"]
        assert health.json()["store"]["journal_unindexed"] >= 2
        assert _metric(admin, "oeh_store_accepting_records") == 0
        assert _metric(admin, "oeh_store_unindexed_records") >= 2

        recovered = httpx.post(server.url + "/admin/store/recover", headers={"authorization": f"Bearer {ADMIN}"})
        assert recovered.status_code == 200, recovered.text
        assert recovered.json()["recovered"] is True and recovered.json()["store"]["failure"] is None
        assert httpx.get(server.url + "/healthz").status_code == 200
        assert httpx.get(server.url + "/readyz").status_code == 200
        assert _chat(s, "after").status_code == 200
        assert admin.health()["status"] == "ok" and _metric(admin, "oeh_store_accepting_records") == 1
        records = admin.records(s["session_id"])
        texts = [r["request"]["messages"][0]["content"] for r in records]
        assert texts == ["before", "acked while the index process is stopped 0",
                         "acked while the index process is stopped 1", "after"]
        assert [r["metadata"]["call_index"] for r in records] == [0, 1, 2, 3]  # the refused call never reached the engine
        assert admin.health()["store"]["journal_unindexed"] == 0
        # a healthy store has nothing to recover
        again = httpx.post(server.url + "/admin/store/recover", headers={"authorization": f"Bearer {ADMIN}"})
        assert again.status_code == 200 and again.json()["recovered"] is False
