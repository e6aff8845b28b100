"""The weight sync on SGLang: through a real recorder (``engine_family="sglang"``) onto the reference engine's
SGLang 0.5.23 flavour. The same order and failure-state rules as on vLLM (``test_weight_sync.py``), through
SGLang's own routes: ``/pause_generation`` and ``/continue_generation`` (reached through the recorder's
fence), ``/update_weights_from_disk``, ``/flush_cache``, ``/update_weight_version`` and ``/model_info``."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from openenv_harness.testing.engine import EngineConfig, Fault, Script, Turn
from openenv_harness.testing.sglang_models import SGLANG_ROUTE_KINDS, check_sglang_payloads
from openenv_harness.trainer.weight_sync import RESET_ATTEMPTS, DiskWeightSync, FenceLeftClosed, SyncRolledBack

TIMEOUT_S = 5.0
MODEL = "sglang-sync"
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
LONG_ANSWER = " ".join(f"word{i}" for i in range(60))


def _folder(root: Path, name: str, weights: bool = True) -> Path:
    folder = root / name
    folder.mkdir()
    if weights:
        (folder / "model.safetensors").write_bytes(b"\0")
    return folder


@pytest.fixture
def folders(tmp_path: Path) -> dict[str, Path]:
    return {"base": _folder(tmp_path, "base"), "v1": _folder(tmp_path, "policy-v1"),
            "empty": _folder(tmp_path, "no-weights", weights=False)}


@pytest.fixture
def stack(make_stack: Any, folders: dict[str, Path]) -> Any:
    return make_stack(EngineConfig(family="sglang", weights_dir=folders["base"], decode_delay_s=0.02),
                      engine_family="sglang", pause_wait_s=0.3)


def _sync(stack: Any, folders: dict[str, Path], **kw: Any) -> DiskWeightSync:
    return DiskWeightSync(stack.admin, stack.engine.url, base_weights=folders["base"], timeout_s=TIMEOUT_S,
                          family="sglang", **kw)


def _agent_call(stack: Any, out: dict[str, Any] | None = None) -> tuple[httpx.Response, dict[str, Any]]:
    session = stack.admin.create_session()
    reply = httpx.post(f"{session['base_url']}/chat/completions", timeout=60,
                       headers={"authorization": f"Bearer {session['secret']}"},
                       json={"model": MODEL, "tools": TOOLS,  # an agent's call (a call without tools is an aux call)
                             "messages": [{"role": "user", "content": "say something long"}]})
    if out is not None:
        out.update(reply=reply, session=session)
    return reply, session


def _served_at(stack: Any, version: int) -> dict[str, Any]:
    """A call after the sync, served and recorded at ``version`` alone; its record."""
    reply, session = _agent_call(stack)
    assert reply.status_code == 200, reply.text
    record: dict[str, Any] = stack.admin.records(session["session_id"])[-1]
    md = record["metadata"]
    assert (md["policy_version_start"], md["policy_version_end"], md["straddled_sync"]) == (version, version, False)
    return record


def test_a_sync_loads_flushes_labels_reads_back_and_bumps(stack: Any, folders: dict[str, Path]) -> None:
    stack.engine.set_script(MODEL, Script(turns=[Turn(content="short")]))
    sync = _sync(stack, folders)
    assert sync.check()["/update_weights_from_disk"] and not sync.check().get("/collective_rpc")
    report = sync.sync(folders["v1"], version_before=0)
    assert (report.outcome, report.version_after, report.method) == ("ok", 1, "update_weights_from_disk")
    assert report.engine_weight_version == "1"  # read back from /model_info
    assert list(report.phases) == ["pause", "load", "reset_cache", "version", "resume"]
    info = stack.engine.info()
    assert (info["weights_path"], info["weight_version"], info["paused"]) == (str(folders["v1"]), "1", False)
    paths = [e["path"] for e in stack.engine.requests()]
    assert paths.index("/pause_generation") < paths.index("/update_weights_from_disk") < paths.index(
        "/flush_cache") < paths.index("/update_weight_version") < paths.index("/continue_generation")
    bodies = {e["path"]: e["body"] for e in stack.engine.requests()}
    assert bodies["/pause_generation"] == {"mode": "retract"}  # wait: drained at the recorder, then retracted
    assert bodies["/update_weight_version"]["abort_all_requests"] is False
    record = _served_at(stack, 1)
    sampled = len(record["completion_token_ids"])
    assert record["metadata"]["weight_versions"] == [{"version": "1", "start": 0, "end": sampled}]


@pytest.mark.slow  # SGLang's own classes are imported from its sources in the engine venv (~20 s of CPU)
def test_the_syncs_requests_are_sglangs_own(stack: Any, folders: dict[str, Path]) -> None:
    stack.engine.set_script(MODEL, Script(turns=[Turn(content="short")]))
    assert _sync(stack, folders).sync(folders["v1"], version_before=0).outcome == "ok"
    control = [e for e in stack.engine.requests() if e["path"] in SGLANG_ROUTE_KINDS and e["path"] != "/v1/chat/completions"]
    verdicts = check_sglang_payloads([{"kind": SGLANG_ROUTE_KINDS[e["path"]][0], "payload": e["body"]} for e in control])
    assert {"/pause_generation", "/update_weights_from_disk", "/update_weight_version",
            "/continue_generation"} <= {e["path"] for e in control}
    # SGLang's own classes; a message's fields are the certification's as written (it probes which reasoning
    # field name the engine renders: SGLang's message model names ``reasoning_content``, not ``reasoning``)
    ours = [[k for k in v["unknown"] if not k.startswith("messages[")] for v in verdicts]
    assert [(v["ok"], u) for v, u in zip(verdicts, ours)] == [(True, [])] * len(control), verdicts


def test_a_call_kept_across_the_sync_is_recorded_as_straddling_with_sglangs_spans(stack: Any,
                                                                                 folders: dict[str, Path]) -> None:
    stack.engine.set_script(MODEL, Script(turns=[Turn(content=LONG_ANSWER)]))
    out: dict[str, Any] = {}
    call = threading.Thread(target=_agent_call, args=(stack, out))
    call.start()
    deadline = time.monotonic() + 30
    while stack.engine.info()["in_flight"] != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # some tokens under the old weights
    report = _sync(stack, folders, pause_mode="keep").sync(folders["v1"], version_before=0)
    call.join(60)
    assert report.outcome == "ok" and out["reply"].status_code == 200, out["reply"].text
    md = stack.admin.records(out["session"]["session_id"])[0]["metadata"]
    assert (md["policy_version_start"], md["policy_version_end"], md["straddled_sync"]) == (0, 1, True)
    spans = md["weight_versions"]
    assert [s["version"] for s in spans] == ["default", "1"] and spans[0]["start"] == 0
    assert spans[0]["end"] == spans[1]["start"] > 0


FAILURES = {
    "reload answers 400": (Fault(route="/update_weights_from_disk", status=400), "load failed"),
    "flush refused every time": (Fault(route="/flush_cache", status=400, count=RESET_ATTEMPTS),
                                 "did not drop its prefix cache in 3 tries"),
    "label not taken": (Fault(route="/update_weight_version", reply={"success": True, "new_version": "1"}),
                        "reports weight version 'default' after it was set to '1'"),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_a_failed_sync_puts_the_old_weights_back_at_the_old_version(stack: Any, folders: dict[str, Path],
                                                                    case: str) -> None:
    fault, message = FAILURES[case]
    stack.engine.set_script(MODEL, Script(turns=[Turn(content="short")]))
    stack.engine.add_fault("*", fault)
    with pytest.raises(SyncRolledBack, match=message) as raised:
        _sync(stack, folders).sync(folders["v1"], version_before=0)
    report = raised.value.report
    assert (report.outcome, report.version_after, report.engine_weights) == ("rolled_back", 0, str(folders["base"]))
    info = stack.engine.info()
    assert (info["weights_path"], info["weight_version"], info["paused"]) == (str(folders["base"]), "default", False)
    assert stack.admin.health()["fence"]["policy_version"] == 0
    _served_at(stack, 0)


def test_a_folder_sglang_cannot_load_is_rolled_back(stack: Any, folders: dict[str, Path]) -> None:
    stack.engine.set_script(MODEL, Script(turns=[Turn(content="short")]))
    with pytest.raises(SyncRolledBack, match="Cannot find any model weights"):
        _sync(stack, folders).sync(folders["empty"], version_before=0)
    assert stack.engine.info()["weights_path"] == str(folders["base"])
    _served_at(stack, 0)


def test_when_the_rollback_fails_too_the_fence_stays_closed_until_recover(stack: Any, folders: dict[str, Path]) -> None:
    stack.engine.set_script(MODEL, Script(turns=[Turn(content="short")]))
    stack.engine.add_fault("*", Fault(route="/update_weights_from_disk", status=400, count=2))
    sync = _sync(stack, folders)
    with pytest.raises(FenceLeftClosed, match="the engine is paused on unknown weights"):
        sync.sync(folders["v1"], version_before=0)
    assert sync.fence_closed and stack.admin.health()["fence"]["paused"] is True
    assert _agent_call(stack)[0].status_code == 503  # held at the recorder, then refused
    recovered = sync.recover()
    assert (recovered.outcome, recovered.version_after, recovered.engine_weights) == (
        "rolled_back", 0, str(folders["base"]))
    _served_at(stack, 0)


def test_an_engine_that_will_not_continue_stays_fenced_at_the_new_weights(stack: Any, folders: dict[str, Path]) -> None:
    stack.engine.set_script(MODEL, Script(turns=[Turn(content="short")]))
    stack.engine.add_fault("*", Fault(route="/continue_generation", status=500))
    sync = _sync(stack, folders)
    with pytest.raises(FenceLeftClosed, match=f"holds {folders['v1']} but did not resume"):
        sync.sync(folders["v1"], version_before=0)
    assert stack.admin.health()["fence"]["paused"] is True
    assert sync.recover().version_after == 1
    _served_at(stack, 1)
