"""vLLM's dev-mode weight routes on the reference engine, over real HTTP: what a reload, a cache reset
and a version label do to the engine's weights state, the wire shapes of vLLM 0.32, and each scripted
fault a weight sync must survive."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from openenv_harness.testing.engine import EngineConfig, EngineServer, Fault, Script, Turn

SYNC_ROUTES = {"/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/weight_info", "/pause",
               "/resume"}


def _folder(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0")
    return folder


@pytest.fixture
def folders(tmp_path: Path) -> dict[str, Path]:
    return {name: _folder(tmp_path, name) for name in ("base", "v1")}


@pytest.fixture
def engine(folders: dict[str, Path]) -> Iterator[EngineServer]:
    config = EngineConfig(weights_dir=folders["base"], decode_delay_s=0.02,
                          default_script=Script(turns=[Turn(content="a reply long enough to be in flight a while " * 10)]))
    with EngineServer(config) as server:
        yield server


def _reload(engine: EngineServer, folder: Path | str, timeout: float = 30) -> httpx.Response:
    return httpx.post(engine.url + "/collective_rpc", timeout=timeout,
                      json={"method": "reload_weights", "kwargs": {"weights_path": str(folder)}})


def test_a_reload_swaps_the_folder_and_stales_the_cache_until_a_reset(engine: EngineServer,
                                                                      folders: dict[str, Path]) -> None:
    start = engine.info()
    assert (start["weights_path"], start["weight_version"], start["prefix_cache_stale"]) == (
        str(folders["base"]), "default", False)
    reply = _reload(engine, folders["v1"])
    assert reply.status_code == 200 and reply.json() == {"results": [None]}  # one worker, reload_weights -> None
    after = engine.info()
    assert (after["weights_path"], after["prefix_cache_stale"], after["weight_reloads"]) == (str(folders["v1"]), True, 1)
    assert httpx.post(engine.url + "/reset_prefix_cache").json() == {"success": True}
    assert engine.info()["prefix_cache_stale"] is False
    set_reply = httpx.post(engine.url + "/update_weight_version", json={"new_version": "1"})
    assert set_reply.json() == {"success": True, "new_version": "1"}
    assert httpx.get(engine.url + "/weight_info").json() == {"weight_version": "1"}
    engine.reset()  # the test controls put the start's weights back
    assert engine.info()["weights_path"] == str(folders["base"])


def test_bad_rpc_bodies_are_400s_and_a_missing_folder_leaves_the_weights_unknown(engine: EngineServer,
                                                                                tmp_path: Path) -> None:
    for body, message in (([1], "Request body must be a JSON object"), ({"kwargs": {}}, "Missing 'method'")):
        reply = httpx.post(engine.url + "/collective_rpc", json=body)
        assert reply.status_code == 400 and message in reply.json()["error"]["message"]
        assert reply.json()["error"]["type"] == "Bad Request"
    assert engine.info()["weight_reloads"] == 0
    other = httpx.post(engine.url + "/collective_rpc", json={"method": "sleep"})
    assert other.status_code == 500 and "reload_weights" in other.json()["error"]["message"]
    empty = tmp_path / "empty"
    empty.mkdir()
    failed = _reload(engine, empty)
    assert failed.status_code == 500
    assert failed.json()["error"] == {"message": f"Call to collective_rpc method failed: Cannot find any model "
                                                 f"weights with `{empty}`", "type": "InternalServerError",
                                      "param": None, "code": 500}
    assert engine.info()["weights_path"] is None  # vLLM's in-place reload had begun: neither policy


def test_the_route_list_names_the_weight_routes_in_dev_mode_only(engine: EngineServer) -> None:
    paths = set(httpx.get(engine.url + "/openapi.json").json()["paths"])
    assert SYNC_ROUTES <= paths and "/v1/chat/completions" in paths
    assert not any(p.startswith("/_ref/") for p in paths)  # test controls are not vLLM's
    with EngineServer(EngineConfig(dev_mode=False)) as plain:
        plain_paths = set(httpx.get(plain.url + "/openapi.json").json()["paths"])
        assert not SYNC_ROUTES & plain_paths
        assert httpx.post(plain.url + "/collective_rpc", json={"method": "reload_weights"}).status_code == 404


def test_a_reload_500_leaves_the_weights_part_loaded(engine: EngineServer, folders: dict[str, Path]) -> None:
    engine.add_fault("*", Fault(route="/collective_rpc", status=500, message="Call to collective_rpc method failed: x"))
    reply = _reload(engine, folders["v1"])
    assert reply.status_code == 500 and reply.json()["error"]["type"] == "InternalServerError"
    assert engine.info()["weights_path"] is None
    assert _reload(engine, folders["base"]).status_code == 200  # count=1: the next reload works
    assert engine.info()["weights_path"] == str(folders["base"])


def test_a_slow_reload_completes_after_its_client_gave_up_and_holds_later_calls(engine: EngineServer,
                                                                                folders: dict[str, Path]) -> None:
    engine.add_fault("*", Fault(route="/collective_rpc", latency_s=1.0))
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        _reload(engine, folders["v1"], timeout=0.3)
    # the engine core still runs it; a reload sent now waits behind it, then runs last
    assert _reload(engine, folders["base"]).status_code == 200
    assert time.monotonic() - started >= 0.9
    info = engine.info()
    assert (info["weights_path"], info["weight_reloads"]) == (str(folders["base"]), 2)


def test_a_reset_that_did_not_happen_says_so(engine: EngineServer, folders: dict[str, Path]) -> None:
    _reload(engine, folders["v1"])
    engine.add_fault("*", Fault(route="/reset_prefix_cache", reply={"success": False}))
    assert httpx.post(engine.url + "/reset_prefix_cache").json() == {"success": False}
    assert engine.info()["prefix_cache_stale"] is True
    assert httpx.post(engine.url + "/reset_prefix_cache").json() == {"success": True}


async def test_running_requests_hold_blocks_so_the_reset_fails_unless_forced(folders: dict[str, Path]) -> None:
    # seconds of prefill: the call is still running when the pause lands, however loaded the machine
    config = EngineConfig(weights_dir=folders["base"], prefill_delay_s=3.0, decode_delay_s=0.02)
    with EngineServer(config) as engine:
        await _kept_call_holds_its_blocks(engine)


async def _kept_call_holds_its_blocks(engine: EngineServer) -> None:
    async with httpx.AsyncClient(base_url=engine.url, timeout=30) as client:
        call = asyncio.create_task(client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "go"}]}))
        while not (await client.get("/_ref/info")).json()["in_flight"]:
            await asyncio.sleep(0.02)
        await client.post("/pause", params={"mode": "keep"})  # the call is kept, holding its blocks
        assert (await client.post("/reset_prefix_cache")).json() == {"success": False}
        forced = await client.post("/reset_prefix_cache", params={"reset_running_requests": "true"})
        assert forced.json() == {"success": True}
        await client.post("/resume")
        assert (await call).status_code == 200


def test_a_resume_that_fails_leaves_the_engine_paused(engine: EngineServer) -> None:
    engine.pause("wait")
    engine.add_fault("*", Fault(route="/resume", status=500))
    reply = httpx.post(engine.url + "/resume")
    assert reply.status_code == 500 and reply.json() == {"error": "Failed to resume generation: injected failure"}
    assert engine.is_paused()
    engine.resume()
    assert not engine.is_paused()


def test_a_version_label_fault_keeps_the_old_label(engine: EngineServer) -> None:
    engine.add_fault("*", Fault(route="/update_weight_version", status=500))
    assert httpx.post(engine.url + "/update_weight_version", json={"new_version": "7"}).status_code == 500
    assert httpx.get(engine.url + "/weight_info").json() == {"weight_version": "default"}


def test_dev_route_faults_are_validated() -> None:
    with pytest.raises(ValidationError, match="reply body replaces the answer of a dev route"):
        Fault(reply={"success": False})  # a sampling route has no reply to replace
    with pytest.raises(ValidationError, match="reply body"):
        Fault(route="/reset_prefix_cache", status=500, reply={"success": False})
    with pytest.raises(ValidationError, match="answers an error status"):
        Fault(route="/v1/chat/completions/render", latency_s=1.0)  # the render route takes statuses only
    assert Fault(route="/collective_rpc", latency_s=2.0).latency_s == 2.0
