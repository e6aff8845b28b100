"""A real Pi rollout run "remotely": the real huggingface_hub.Sandbox client against the local HF
emulator, the agent inside reaching the trainer-side recorder only through the WebSocket relay.
Its records must match the same rollout run locally in shape and chain status (D18: only the base
URL differs)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from openenv_harness.harnesses.install import ensure_installed
from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.rollout.report import run_rollout
from openenv_harness.sandbox.hf import HFSandbox
from openenv_harness.testing.engine import EngineServer, Script
from openenv_harness.testing.hf_emulator import HFEmulator, hub_pointed_at

pytestmark = pytest.mark.cli
ADMIN = "hf-rollout-admin-token-0123456789"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[EngineServer, RecorderServer]]:
    with EngineServer() as engine:
        engine.set_script("ref-fix-add", Script(turns=BUILTIN_TASKS["fix-add"].reference_script))
        config = RecorderConfig(store_path=str(tmp_path / "records.db"), engine_url=engine.url, admin_token=ADMIN)
        with RecorderServer(config) as recorder:
            yield engine, recorder


def shape(records: list[dict]) -> list[tuple]:
    return [
        (r["metadata"]["call_kind"], r["metadata"]["status"], (r["metadata"].get("fidelity") or {}).get("class"),
         len(r["prompt_token_ids"]) > 0, len(r["completion_token_ids"]), sorted(r), sorted(r["metadata"]))
        for r in records
    ]


def test_remote_pi_rollout_matches_local(tmp_path: Path, stack) -> None:
    engine, recorder = stack
    binary = str(ensure_installed(["pi"])["pi"])

    def factory(sandbox_factory=None) -> HarnessSessionFactory:
        return HarnessSessionFactory(harness="pi", recorder_url=recorder.url, admin_token=ADMIN, model="ref-fix-add",
                                     executable=binary, sandbox_factory=sandbox_factory)

    local, local_session = run_rollout(factory(), "fix-add", timeout_s=120)
    local_session.close()
    with HFEmulator() as emulator, hub_pointed_at(emulator, tmp_path / "hf-home"):
        remote, remote_session = run_rollout(factory(lambda: HFSandbox(ws_scheme="ws://")), "fix-add", timeout_s=180)
        try:
            assert remote.exit_code == 0 and remote.reward == 1.0, remote
            # the agent inside saw a localhost relay URL, never the recorder's address
            models = remote_session.sandbox.read_file(
                f"{remote_session.sandbox.home}/.pi/agent/models.json").decode()
            assert "127.0.0.1" in models and recorder.url not in models
            assert f"/rollout/{remote.session_id}/v1" in models
        finally:
            remote_session.close()
    assert local.exit_code == 0 and local.reward == 1.0
    with RecorderClient(recorder.url, ADMIN) as admin:
        local_records = admin.records(local.session_id)
        remote_records = admin.records(remote.session_id)
    assert shape(remote_records) == shape(local_records)
    assert [r["metadata"]["fidelity"]["class"] for r in remote_records] == ["root", "exact", "exact", "exact"]
    assert remote.fidelity == local.fidelity and remote.rows == local.rows == 1


def test_remote_codex_rollout_speaks_the_responses_api_through_the_relay(tmp_path: Path, stack) -> None:
    from openenv_harness.rollout.taskset import script_for

    engine, recorder = stack
    engine.set_script("ref-fix-add-codex", Script(turns=script_for(BUILTIN_TASKS["fix-add"].reference_script, "codex")))
    binary = str(ensure_installed(["codex"])["codex"])
    factory = HarnessSessionFactory(harness="codex", recorder_url=recorder.url, admin_token=ADMIN,
                                    model="ref-fix-add-codex", executable=binary,
                                    sandbox_factory=lambda: HFSandbox(ws_scheme="ws://"))
    with HFEmulator() as emulator, hub_pointed_at(emulator, tmp_path / "hf-home"):
        remote, session = run_rollout(factory, "fix-add", timeout_s=180)
        try:
            assert remote.exit_code == 0 and remote.reward == 1.0, remote
            config = session.sandbox.read_file(f"{session.sandbox.home}/.codex/config.toml").decode()
            assert "127.0.0.1" in config and recorder.url not in config  # the relay's address, not ours
            assert f"/rollout/{remote.session_id}/v1" in config
        finally:
            session.close()
    with RecorderClient(recorder.url, ADMIN) as admin:
        records = admin.records(remote.session_id)
    assert [r["metadata"]["dialect"] for r in records] == ["responses"] * 4
    assert [r["metadata"]["stream"] for r in records] == [True] * 4  # the event stream came back through the relay
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact", "exact", "exact"]
    sampled = [r["sampled"]["token_ids"] for r in engine.requests("ref-fix-add-codex")]
    assert [r["completion_token_ids"] for r in records] == sampled
