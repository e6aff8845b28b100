"""The weight sync through a real recorder over loopback, onto the reference engine, through each way
it fails: the version advances only once the new weights are loaded, the cache dropped and the label
read back; a failure puts the old weights back and resumes at the old version; when that fails too
the fence stays closed until ``recover()``. After each, an agent call through the recorder says which
version served it, and the engine's loaded folder says which weights did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from openenv_harness.testing.engine import EngineConfig, Fault
from openenv_harness.trainer.weight_sync import (
    RESET_ATTEMPTS,
    DiskWeightSync,
    FenceLeftClosed,
    SyncRolledBack,
    WeightSyncError,
)

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
#: a reload slower than the client's timeout: the engine still finishes it, and the rollback's reload
#: waits behind it (the engine runs one at a time) well within its own timeout
TIMEOUT_S, SLOW_RELOAD_S = 2.0, 3.0


def _folder(root: Path, name: str, weights: bool = True) -> Path:
    folder = root / name
    folder.mkdir()
    if weights:
        (folder / "model.safetensors").write_bytes(b"\0")
    return folder


@pytest.fixture
def folders(tmp_path: Path) -> dict[str, Path]:
    return {"base": _folder(tmp_path, "base"), "v1": _folder(tmp_path, "policy-v1"),
            "v2": _folder(tmp_path, "policy-v2"), "empty": _folder(tmp_path, "no-weights", weights=False)}


@pytest.fixture
def stack(make_stack: Any, folders: dict[str, Path]) -> Any:
    return make_stack(EngineConfig(weights_dir=folders["base"]), pause_wait_s=0.3)


def _sync(stack: Any, folders: dict[str, Path] | None, **kw: Any) -> DiskWeightSync:
    base = folders["base"] if folders is not None else None
    return DiskWeightSync(stack.admin, stack.engine.url, base_weights=base, timeout_s=TIMEOUT_S, **kw)


def _agent_call(stack: Any) -> tuple[httpx.Response, list[dict[str, Any]]]:
    """One agent-style call (it offers tools) through the recorder, and the session's records."""
    session = stack.admin.create_session()
    reply = httpx.post(f"{session['base_url']}/chat/completions", timeout=60,
                       headers={"authorization": f"Bearer {session['secret']}"},
                       json={"model": "reference-model", "tools": TOOLS,
                             "messages": [{"role": "user", "content": "list the files"}]})
    return reply, stack.admin.records(session["session_id"])


def _served_at(stack: Any, version: int) -> None:
    """A call after the sync is served, and recorded as served, by ``version`` alone."""
    reply, records = _agent_call(stack)
    assert reply.status_code == 200, reply.text
    md = records[-1]["metadata"]
    assert (md["policy_version_start"], md["policy_version_end"], md["straddled_sync"]) == (version, version, False)


def _engine(stack: Any) -> dict[str, Any]:
    return stack.engine.info()


def test_a_sync_advances_only_after_load_reset_and_label_and_reads_the_label_back(stack: Any, folders) -> None:
    sync = _sync(stack, folders)
    report = sync.sync(folders["v1"], version_before=0)
    assert (report.outcome, report.version_before, report.version_after) == ("ok", 0, 1)
    assert report.engine_weight_version == "1"  # read back from /weight_info, not our own string
    assert list(report.phases) == ["pause", "load", "reset_cache", "version", "resume"]
    engine = _engine(stack)
    assert (engine["weights_path"], engine["weight_version"], engine["prefix_cache_stale"]) == (
        str(folders["v1"]), "1", False)
    assert engine["prefix_cache_resets"] == 1 and not engine["paused"]
    fence = stack.admin.health()["fence"]
    assert (fence["policy_version"], fence["paused"]) == (1, False)
    assert sync.loaded == folders["v1"]
    _served_at(stack, 1)


def test_an_engine_that_takes_no_label_but_says_it_did_is_caught_by_the_read_back(stack: Any, folders) -> None:
    """``/update_weight_version`` answers success without setting it: ``/weight_info`` tells."""
    stack.engine.add_fault("*", Fault(route="/update_weight_version", reply={"success": True, "new_version": "1"}))
    with pytest.raises(SyncRolledBack, match="reports weight version 'default' after it was set to '1'"):
        _sync(stack, folders).sync(folders["v1"], version_before=0)
    assert _engine(stack)["weights_path"] == str(folders["base"])
    _served_at(stack, 0)


FAILURES = {
    "reload answers 500": (Fault(route="/collective_rpc", status=500), "load failed: /collective_rpc answered 500"),
    "reload outlives the timeout": (Fault(route="/collective_rpc", latency_s=SLOW_RELOAD_S),
                                    "/collective_rpc did not answer within 2 s"),
    "reset answers success false": (Fault(route="/reset_prefix_cache", reply={"success": False}, count=RESET_ATTEMPTS),
                                    "did not drop its prefix cache in 3 tries"),
    "label answers 500": (Fault(route="/update_weight_version", status=500), "version failed"),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_a_failed_sync_puts_the_old_weights_back_at_the_old_version(stack: Any, folders, case: str) -> None:
    fault, message = FAILURES[case]
    stack.engine.add_fault("*", fault)
    sync = _sync(stack, folders)
    with pytest.raises(SyncRolledBack, match=message) as raised:
        sync.sync(folders["v1"], version_before=0)
    report = raised.value.report
    assert (report.outcome, report.version_after, report.engine_weights) == ("rolled_back", 0, str(folders["base"]))
    assert report.engine_weight_version == "default" and "roll_back" in report.phases
    engine = _engine(stack)
    assert (engine["weights_path"], engine["weight_version"], engine["prefix_cache_stale"], engine["paused"]) == (
        str(folders["base"]), "default", False, False)
    fence = stack.admin.health()["fence"]
    assert (fence["policy_version"], fence["paused"]) == (0, False)  # never bumped
    assert sync.loaded == folders["base"] and not sync.fence_closed
    _served_at(stack, 0)
    # the next sync starts from a defined state and works
    assert sync.sync(folders["v1"], version_before=0).version_after == 1
    _served_at(stack, 1)


def test_a_folder_the_engine_cannot_load_is_rolled_back_to_the_last_folder_loaded_in_full(stack: Any,
                                                                                        folders) -> None:
    sync = _sync(stack, folders)
    sync.sync(folders["v1"], version_before=0)
    with pytest.raises(SyncRolledBack, match="Cannot find any model weights") as raised:
        sync.sync(folders["empty"], version_before=1)
    assert raised.value.report.engine_weights == str(folders["v1"])  # not the base: v1 was loaded in full
    engine = _engine(stack)
    assert (engine["weights_path"], engine["weight_version"]) == (str(folders["v1"]), "1")
    assert stack.admin.health()["fence"]["policy_version"] == 1
    _served_at(stack, 1)


def test_when_the_rollback_fails_too_the_fence_stays_closed_until_recover(stack: Any, folders) -> None:
    stack.engine.add_fault("*", Fault(route="/collective_rpc", status=500, count=2))  # the reload and the rollback's
    sync = _sync(stack, folders)
    with pytest.raises(FenceLeftClosed, match="The fence is left closed: the engine is paused on unknown weights") \
            as raised:
        sync.sync(folders["v1"], version_before=0)
    assert "recover() loads" in str(raised.value) and str(folders["base"]) in str(raised.value)
    report = raised.value.report
    assert (report.outcome, report.engine_weights) == ("fence_closed", None)
    assert sync.fence_closed and _engine(stack)["weights_path"] is None and stack.engine.is_paused()
    fence = stack.admin.health()["fence"]
    assert (fence["policy_version"], fence["paused"]) == (0, True)
    reply, records = _agent_call(stack)  # held at the recorder, then refused: never served by unknown weights
    assert reply.status_code == 503 and reply.json()["error"]["code"] == "engine_paused"
    assert records == []
    with pytest.raises(WeightSyncError, match="call recover\\(\\) first"):
        sync.sync(folders["v2"], version_before=0)
    recovered = sync.recover()
    assert (recovered.outcome, recovered.version_after, recovered.engine_weights) == (
        "rolled_back", 0, str(folders["base"]))
    assert not sync.fence_closed and _engine(stack)["weights_path"] == str(folders["base"])
    _served_at(stack, 0)
    with pytest.raises(WeightSyncError, match="nothing to recover"):
        sync.recover()


def test_an_engine_that_will_not_resume_after_a_good_load_stays_fenced_at_the_new_weights(stack: Any,
                                                                                         folders) -> None:
    stack.engine.add_fault("*", Fault(route="/resume", status=500))
    sync = _sync(stack, folders)
    with pytest.raises(FenceLeftClosed, match=f"holds {folders['v1']} but did not resume") as raised:
        sync.sync(folders["v1"], version_before=0)
    assert raised.value.report.engine_weights == str(folders["v1"]) and raised.value.report.version_after == 1
    assert stack.admin.health()["fence"]["paused"] is True and stack.engine.is_paused()
    assert _agent_call(stack)[0].status_code == 503
    recovered = sync.recover()
    assert (recovered.outcome, recovered.version_after, recovered.engine_weight_version) == ("ok", 1, "1")
    assert _engine(stack)["weights_path"] == str(folders["v1"])
    _served_at(stack, 1)


def test_a_rollback_whose_resume_fails_holds_the_old_weights_behind_the_fence(stack: Any, folders) -> None:
    stack.engine.add_fault("*", Fault(route="/collective_rpc", status=500))
    stack.engine.add_fault("*", Fault(route="/resume", status=500))
    sync = _sync(stack, folders)
    with pytest.raises(FenceLeftClosed, match=f"the engine is paused holding {folders['base']}"):
        sync.sync(folders["v1"], version_before=0)
    assert _engine(stack)["weights_path"] == str(folders["base"]) and stack.admin.health()["fence"]["paused"]
    assert sync.recover().version_after == 0
    _served_at(stack, 0)


def test_without_a_known_folder_a_failed_reload_leaves_the_fence_closed_and_says_to_restart(stack: Any,
                                                                                          folders) -> None:
    stack.engine.add_fault("*", Fault(route="/collective_rpc", status=500))
    with pytest.raises(FenceLeftClosed, match="no weights folder is known: restart the engine"):
        _sync(stack, None).sync(folders["v1"], version_before=0)
    assert stack.admin.health()["fence"]["paused"] is True


def test_a_pause_the_engine_refuses_changes_nothing(stack: Any, folders) -> None:
    stack.engine.add_fault("*", Fault(route="/pause", status=500))
    with pytest.raises(WeightSyncError, match="could not be paused, nothing was changed"):
        _sync(stack, folders).sync(folders["v1"], version_before=0)
    assert _engine(stack)["weight_reloads"] == 0
    fence = stack.admin.health()["fence"]
    assert (fence["policy_version"], fence["paused"]) == (0, False)
    _served_at(stack, 0)
