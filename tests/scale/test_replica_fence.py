"""The weight-sync fence over engine replicas behind the real vllm-router: the recorder pauses and
resumes every replica (the router sends ``/pause`` to one), one policy version for all, a call kept
across the sync on any replica is flagged, and a replica that cannot pause fails the pause clearly
with the others resumed."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from openenv_harness.engine.router import VLLMRouter
from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.client import RecorderAPIError
from openenv_harness.testing.engine import EngineConfig, EngineServer

from agentloop import ADMIN, TOOLS, tool_script
from replica_keys import key_for_each

LONG = "a long enough answer to take a while to decode " * 3


@pytest.fixture(scope="module")
def slow_replicas() -> Iterator[list[EngineServer]]:
    engines = [EngineServer(EngineConfig(decode_delay_s=0.03)).start() for _ in range(2)]
    try:
        yield engines
    finally:
        for engine in engines:
            engine.stop()


@pytest.fixture(scope="module")
def slow_router(slow_replicas: list[EngineServer], tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMRouter]:
    with VLLMRouter([e.url for e in slow_replicas], log_path=tmp_path_factory.mktemp("r") / "router.log") as r:
        yield r


@pytest.fixture(autouse=True)
def _fresh(slow_replicas: list[EngineServer]) -> None:
    for engine in slow_replicas:
        engine.reset()


def _recorder(tmp_path: Path, router: VLLMRouter, **config: Any) -> RecorderServer:
    return RecorderServer(RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=router.url,
                                         admin_token=ADMIN, **config)).start()


def _chat(s: dict[str, Any], text: str) -> httpx.Response:
    return httpx.post(f"{s['base_url']}/chat/completions", timeout=60, headers={"authorization": f"Bearer {s['secret']}"},
                      json={"model": "reference-model", "messages": [{"role": "user", "content": text}], "tools": TOOLS})


def test_pause_and_resume_reach_every_replica(tmp_path: Path, slow_router: VLLMRouter,
                                              slow_replicas: list[EngineServer]) -> None:
    server = _recorder(tmp_path, slow_router, engine_replicas=[e.url for e in slow_replicas])
    try:
        with RecorderClient(server.url, ADMIN) as admin:
            paused = admin.pause_engine("keep")
            assert paused["paused"] is True
            assert sorted(paused["engine"]["replicas"]) == sorted(e.url for e in slow_replicas)
            assert all(e.is_paused() for e in slow_replicas)
            resumed = admin.resume_engine()
            assert resumed["paused"] is False and resumed["policy_version"] == 1
            assert not any(e.is_paused() for e in slow_replicas)
    finally:
        server.stop()


def test_the_replicas_can_come_from_the_routers_worker_list(tmp_path: Path, slow_router: VLLMRouter,
                                                            slow_replicas: list[EngineServer]) -> None:
    server = _recorder(tmp_path, slow_router, engine_replicas_from_router=True)
    try:
        with RecorderClient(server.url, ADMIN) as admin:
            admin.pause_engine("keep")
            assert all(e.is_paused() for e in slow_replicas)
            admin.resume_engine()
            assert not any(e.is_paused() for e in slow_replicas)
    finally:
        server.stop()


def test_a_call_kept_across_the_sync_on_any_replica_is_flagged(tmp_path: Path, slow_router: VLLMRouter,
                                                               slow_replicas: list[EngineServer]) -> None:
    server = _recorder(tmp_path, slow_router, engine_replicas=[e.url for e in slow_replicas])
    try:
        with RecorderClient(server.url, ADMIN) as admin:
            sessions = [admin.create_session(affinity_key=key) for key in key_for_each(slow_router, slow_replicas)]
            for s in sessions:
                for engine in slow_replicas:
                    engine.set_script(s["session_id"], tool_script(0, final=LONG))
            replies: dict[str, httpx.Response] = {}
            threads = [threading.Thread(target=lambda s=s: replies.setdefault(s["session_id"], _chat(s, "go")))
                       for s in sessions]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 30
            # each call has reached its replica (and so has its start version) before the pause
            while not all(e.requests() for e in slow_replicas):
                assert time.monotonic() < deadline, "the calls did not reach both replicas"
                time.sleep(0.01)
            admin.pause_engine("keep")
            admin.resume_engine()
            for t in threads:
                t.join(60)
            for s, engine in zip(sessions, slow_replicas):
                assert replies[s["session_id"]].status_code == 200
                assert [e["session"] for e in engine.requests()] == [s["session_id"]]  # served by this replica
                [record] = admin.records(s["session_id"])
                md = record["metadata"]
                assert (md["policy_version_start"], md["policy_version_end"], md["straddled_sync"]) == (0, 1, True)
            # after the sync every replica serves version 1
            for s in sessions:
                _chat(s, "after")
                md = admin.records(s["session_id"])[-1]["metadata"]
                assert (md["policy_version_start"], md["policy_version_end"], md["straddled_sync"]) == (1, 1, False)
    finally:
        server.stop()


def test_a_replica_that_cannot_pause_fails_the_pause_and_the_others_resume(
        tmp_path: Path, slow_router: VLLMRouter, slow_replicas: list[EngineServer]) -> None:
    # a replica started without vLLM's dev mode has no /pause (404)
    with EngineServer(EngineConfig(dev_mode=False)) as no_dev_mode:
        server = _recorder(tmp_path, slow_router, engine_replicas=[*(e.url for e in slow_replicas), no_dev_mode.url])
        try:
            with RecorderClient(server.url, ADMIN) as admin:
                with pytest.raises(RecorderAPIError) as err:
                    admin.pause_engine("keep")
                assert err.value.status == 502
                assert no_dev_mode.url in err.value.message and "HTTP 404" in err.value.message
                assert "Resumed the 2 replica(s) that had paused" in err.value.message
                assert not any(e.is_paused() for e in slow_replicas)
                assert admin.health()["fence"]["paused"] is False
                s = admin.create_session()
                for engine in slow_replicas:
                    engine.set_script(s["session_id"], tool_script(0, final="ok"))
                assert _chat(s, "still served").status_code == 200
        finally:
            server.stop()


def test_a_replica_that_does_not_resume_keeps_the_fence_closed_until_a_retry(
        tmp_path: Path, slow_router: VLLMRouter, slow_replicas: list[EngineServer]) -> None:
    extra = EngineServer().start()
    port = extra.port
    server = _recorder(tmp_path, slow_router, engine_replicas=[*(e.url for e in slow_replicas), extra.url])
    try:
        with RecorderClient(server.url, ADMIN) as admin:
            admin.pause_engine("keep")
            extra.stop()  # the replica goes away while paused
            with pytest.raises(RecorderAPIError) as err:
                admin.resume_engine()
            assert err.value.status == 502 and f"127.0.0.1:{port}" in err.value.message
            assert "The fence stays closed" in err.value.message
            assert admin.health()["fence"]["paused"] is True
            assert not any(e.is_paused() for e in slow_replicas)  # the others were resumed
            extra = EngineServer(port=port).start()  # the replica is back
            resumed = admin.resume_engine()
            assert resumed["paused"] is False and resumed["policy_version"] == 1  # one bump for the sync
    finally:
        server.stop()
        extra.stop()
