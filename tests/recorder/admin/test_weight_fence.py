"""The weight-sync fence (D12): pause/resume through the recorder, policy versions on every record,
calls straddling a sync flagged, calls during a pause held (bounded) then 503 + Retry-After."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.client import RecorderAPIError
from openenv_harness.recorder.fence import Fence
from openenv_harness.recorder.upstream.base import Upstream, UpstreamFailure, UpstreamReply
from openenv_harness.recorder.upstream.h1_engine import H1Engine
from openenv_harness.testing.engine import EngineConfig, EngineServer

from agentloop import ADMIN, TOOLS, tool_script


@pytest.fixture
def slow_stack(tmp_path: Path):
    engine = EngineServer(EngineConfig(decode_delay_s=0.03)).start()
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN,
                            pause_wait_s=0.5, retry_after_s=3)
    server = RecorderServer(config).start()
    client = RecorderClient(server.url, ADMIN)
    yield engine, server, client
    client.close()
    server.stop()
    engine.stop()


def chat(s: dict, text: str) -> httpx.Response:
    return httpx.post(f"{s['base_url']}/chat/completions", timeout=60, headers={"authorization": f"Bearer {s['secret']}"},
                      json={"model": "reference-model", "messages": [{"role": "user", "content": text}], "tools": TOOLS})


def test_keep_mode_pause_straddles_and_is_flagged(slow_stack) -> None:
    engine, server, admin = slow_stack
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(0, final="a long enough answer to take a while to decode " * 2))
    result: dict = {}
    t = threading.Thread(target=lambda: result.setdefault("r", chat(s, "straddle")))
    t.start()
    time.sleep(0.3)  # the call is decoding on the engine
    state = admin.pause_engine("keep")
    assert state["paused"] is True and engine.is_paused()
    time.sleep(0.4)
    assert t.is_alive()  # keep mode: the in-flight call is frozen, not failed
    resumed = admin.resume_engine()
    assert resumed["policy_version"] == 1 and not resumed["paused"]
    t.join(30)
    assert result["r"].status_code == 200  # never a torn generation
    md = admin.records(s["session_id"])[0]["metadata"]
    assert (md["policy_version_start"], md["policy_version_end"], md["straddled_sync"]) == (0, 1, True)
    # a call after the sync is served by version 1 alone
    chat(s, "after")
    md2 = admin.records(s["session_id"])[1]["metadata"]
    assert (md2["policy_version_start"], md2["policy_version_end"], md2["straddled_sync"]) == (1, 1, False)
    assert "oeh_straddled_sync_total 1.0" in admin.metrics_text()


def test_calls_during_a_pause_wait_then_get_503(slow_stack) -> None:
    engine, server, admin = slow_stack
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(0, final="ok"))
    admin.pause_engine("keep")
    started = time.monotonic()
    r = chat(s, "blocked")
    waited = time.monotonic() - started
    assert r.status_code == 503 and r.headers["retry-after"] == "3"
    assert r.json()["error"]["code"] == "engine_paused" and waited >= 0.45
    assert admin.records(s["session_id"]) == []  # never reached the engine
    # a call that arrives during the pause and sees the resume in time is served
    t = threading.Thread(target=lambda: time.sleep(0.2) or admin.resume_engine())
    t.start()
    assert chat(s, "held").status_code == 200
    t.join()
    assert admin.records(s["session_id"])[0]["metadata"]["policy_version_start"] == 1


def test_external_fence_and_explicit_version(slow_stack) -> None:
    engine, server, admin = slow_stack
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(0, final="ok"))
    admin.set_policy_version(7)
    chat(s, "v7")
    h = {"authorization": f"Bearer {ADMIN}"}
    assert httpx.post(server.url + "/admin/fence/pause", headers=h).json()["paused"] is True
    assert not engine.is_paused()  # the trainer fences the engine itself; the recorder only holds calls
    assert chat(s, "held").status_code == 503
    assert httpx.post(server.url + "/admin/fence/resume", headers=h).json()["policy_version"] == 8
    chat(s, "v8")
    versions = [r["metadata"]["policy_version_start"] for r in admin.records(s["session_id"])]
    assert versions == [7, 8]


def test_a_resume_without_bump_serves_the_old_version_again(slow_stack) -> None:
    """What a sync that put the old weights back resumes with: the engine and the fence open, the
    version as it stood (a call after it is the old policy's, and says so)."""
    engine, server, admin = slow_stack
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(0, final="ok"))
    admin.set_policy_version(4)
    admin.pause_engine("wait")
    assert engine.is_paused()
    state = admin.resume_engine(bump=False)
    assert (state["policy_version"], state["paused"]) == (4, False) and not engine.is_paused()
    assert chat(s, "old policy").status_code == 200
    md = admin.records(s["session_id"])[0]["metadata"]
    assert (md["policy_version_start"], md["policy_version_end"], md["straddled_sync"]) == (4, 4, False)
    admin.pause_engine("wait")
    assert admin.resume_engine()["policy_version"] == 5  # the default still bumps


def test_lora_sync_serves_the_published_adapter_name(slow_stack) -> None:
    engine, server, admin = slow_stack
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(0, final="ok"))
    h = {"authorization": f"Bearer {ADMIN}"}
    state = httpx.post(server.url + "/admin/policy_version", headers=h, json={"version": 3, "model": "policy-v3"}).json()
    assert state["served_model"] == "policy-v3"
    chat(s, "lora")
    assert engine.requests(s["session_id"])[-1]["body"]["model"] == "policy-v3"
    rec = admin.records(s["session_id"])[-1]
    assert rec["request"]["model"] == "reference-model"  # what the agent asked for stays in the record
    assert rec["metadata"]["provenance"]["model"] == "policy-v3"  # what served it is provenance
    assert rec["metadata"]["policy_version_start"] == 3


class _ResumeHeldUntilCallsEnd(Upstream):
    """A test double around the real engine client: the engine's ``/resume`` answer reaches the
    recorder only once every call in flight has come back from the engine -- the widest window a
    real engine can open between resuming its generations and acknowledging the resume."""

    def __init__(self, inner: H1Engine, fence: Callable[[], Fence]) -> None:
        self.inner, self.fence, self.name = inner, fence, inner.name

    async def start(self) -> None:
        await self.inner.start()

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def chat(self, body: dict, *, session_id: str, affinity: str | None = None) -> UpstreamReply:
        return await self.inner.chat(body, session_id=session_id)

    async def request(self, method: str, path: str, *, json: object = None,
                      params: dict[str, str] | None = None) -> UpstreamReply:
        reply = await self.inner.request(method, path, json=json, params=params)
        if path == "/resume":
            async with asyncio.timeout(30):
                while self.fence().inflight:
                    await asyncio.sleep(0.01)
        return reply


def test_a_call_the_engine_finishes_before_acknowledging_resume_gets_the_new_version(tmp_path: Path) -> None:
    """The version is bumped before the engine resumes: a kept call that the engine finishes (under the
    new weights) before the recorder hears back from ``/resume`` still ends at the new version."""
    engine = EngineServer(EngineConfig(decode_delay_s=0.01)).start()
    server = None
    try:
        config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN)
        holder: dict = {}
        upstream = _ResumeHeldUntilCallsEnd(H1Engine(engine.url), lambda: holder["server"].ctx.fence)
        server = holder["server"] = RecorderServer(config, upstreams={"default": upstream}).start()
        admin = RecorderClient(server.url, ADMIN)
        s = admin.create_session()
        engine.set_script(s["session_id"], tool_script(0, final="kept across the sync"))
        engine.pause("keep")  # the engine holds the call from its first token on
        result: dict = {}
        t = threading.Thread(target=lambda: result.setdefault("r", chat(s, "straddle")))
        t.start()
        deadline = time.monotonic() + 30
        while server.ctx.fence.inflight == 0:  # the call is at the engine
            assert time.monotonic() < deadline and t.is_alive()
            time.sleep(0.01)
        admin.pause_engine("keep")
        assert admin.resume_engine()["policy_version"] == 1
        t.join(30)
        assert result["r"].status_code == 200
        md = admin.records(s["session_id"])[0]["metadata"]
        assert (md["policy_version_start"], md["policy_version_end"], md["straddled_sync"]) == (0, 1, True)
        admin.close()
    finally:
        if server is not None:
            server.stop()
        engine.stop()


class _FirstResumeFails(_ResumeHeldUntilCallsEnd):
    """A test double: the engine's first ``/resume`` never answers (the connection drops)."""

    failed = False

    async def request(self, method: str, path: str, *, json: object = None,
                      params: dict[str, str] | None = None) -> UpstreamReply:
        if path == "/resume" and not self.failed:
            self.failed = True
            raise UpstreamFailure("connect", "engine closed the connection before answering")
        return await super().request(method, path, json=json, params=params)


def test_a_failed_engine_resume_leaves_the_fence_closed_and_a_retry_bumps_once(tmp_path: Path) -> None:
    engine = EngineServer().start()
    holder: dict = {}
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN,
                            pause_wait_s=0.2)
    upstream = _FirstResumeFails(H1Engine(engine.url), lambda: holder["server"].ctx.fence)
    server = holder["server"] = RecorderServer(config, upstreams={"default": upstream}).start()
    try:
        with RecorderClient(server.url, ADMIN) as admin:
            s = admin.create_session()
            engine.set_script(s["session_id"], tool_script(0, final="ok"))
            admin.pause_engine("keep")
            with pytest.raises(RecorderAPIError) as failed:
                admin.resume_engine()
            assert failed.value.status == 502
            assert admin.health()["fence"]["paused"] is True  # no call reaches an engine in an unknown state
            assert chat(s, "held").status_code == 503
            resumed = admin.resume_engine()  # the trainer retries: one sync, one new version
            assert resumed["policy_version"] == 1 and resumed["paused"] is False
            assert chat(s, "after").status_code == 200
            md = admin.records(s["session_id"])[0]["metadata"]
            assert (md["policy_version_start"], md["policy_version_end"]) == (1, 1)
    finally:
        server.stop()
        engine.stop()


@pytest.mark.slow  # the pause waits out a 3 s prefill, twice (~7 s)
def test_a_wait_pause_outlasts_the_clients_default_timeout(tmp_path: Path) -> None:
    """``pause_engine("wait")`` returns when the engine's calls in flight are done, however long they
    take; the client's timeout, sized for quick admin calls, must not cut it (a real engine's long
    generation made it time out). An explicit ``timeout_s`` is still the caller's bound."""
    engine = EngineServer(EngineConfig(prefill_delay_s=3.0)).start()
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN)
    server = RecorderServer(config).start()

    def call_in_flight(s: dict, text: str, result: dict) -> threading.Thread:
        t = threading.Thread(target=lambda: result.setdefault(text, chat(s, text)), daemon=True)
        t.start()
        deadline = time.monotonic() + 30
        while not engine.info()["in_flight"]:
            assert time.monotonic() < deadline, "the call never reached the engine"
            time.sleep(0.02)
        return t

    try:
        with RecorderClient(server.url, ADMIN, timeout_s=1.0) as admin:
            s = admin.create_session()
            engine.set_script(s["session_id"], tool_script(0, final="done"))
            result: dict = {}
            t = call_in_flight(s, "a call the pause waits for", result)
            state = admin.pause_engine("wait")  # its prefill alone outlasts the client's 1 s
            assert state["paused"] is True and engine.info()["in_flight"] == 0
            admin.resume_engine()
            t.join(30)
            assert result["a call the pause waits for"].status_code == 200
            t = call_in_flight(s, "another", result)
            with pytest.raises(httpx.TimeoutException):
                admin.pause_engine("wait", timeout_s=0.5)
            t.join(30)
    finally:
        server.stop()
        engine.stop()
