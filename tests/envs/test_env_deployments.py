"""The two deployments a trainer uses: our recorder in front of its engine, or its own recorder.

The trainer's engine is played by the reference engine (the one thing here that cannot be real: a
GPU vLLM), serving the task's scripted solution under the model name the trainer configured.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness_env import HarnessEnv, RunAgent, fetch_records

from openenv_harness.recorder import RecorderConfig, RecorderServer
from openenv_harness.rollout import BUILTIN_TASKS
from openenv_harness.testing.engine import EngineServer, Script

from conftest import ADMIN, backend_of, start_env_server
from harness_env.server.config import EnvServerConfig

pytestmark = pytest.mark.cli
MODEL = "trainer/policy-7b"


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineServer]:
    with EngineServer() as e:
        e.set_script(MODEL, Script(turns=BUILTIN_TASKS["write-greeting"].reference_script))
        yield e


def _run(server_url: str) -> tuple:
    with HarnessEnv(base_url=server_url).sync() as env:
        env.reset(task_id="write-greeting", harness="pi")
        result = env.step(RunAgent(timeout_s=120))
    return result, result.observation


def test_engine_deployment_records_in_process_and_serves_them(engine: EngineServer, pi_cli: Path,
                                                              tmp_path: Path) -> None:
    config = EnvServerConfig.from_environ({"OEH_ENGINE_URL": engine.url, "OEH_MODEL": MODEL,
                                           "OEH_ADMIN_TOKEN": ADMIN, "OEH_DATA_DIR": str(tmp_path)})
    server = start_env_server(config)
    try:
        assert backend_of(server).owns_recorder
        result, obs = _run(server.url)
        assert result.reward == 1.0, (obs.error, obs.verify_output)
        assert obs.trace is not None and obs.trace.chain_status.startswith("exact (")
        assert obs.records is not None and obs.records.proxy_path
        records = fetch_records(obs.records, ADMIN, server.url)
        agent = [r for r in records if r["metadata"]["call_kind"] == "agent"]
        assert len(agent) == obs.trace.agent_calls == 2
        assert {r["metadata"]["provenance"]["model"] for r in agent} == {MODEL}
        assert (tmp_path / "records.db").is_file()  # OEH_DATA_DIR holds the records
    finally:
        server.stop()


def test_external_recorder_deployment_leaves_records_with_the_trainer(engine: EngineServer, pi_cli: Path,
                                                                      tmp_path: Path) -> None:
    token = "trainer-owned-admin-token-000000"
    recorder = RecorderServer(RecorderConfig(store_path=str(tmp_path / "trainer.db"), engine_url=engine.url,
                                             admin_token=token)).start()
    config = EnvServerConfig.from_environ({"OEH_RECORDER_URL": recorder.url, "OEH_ADMIN_TOKEN": token,
                                           "OEH_MODEL": MODEL})
    server = start_env_server(config)
    try:
        assert not backend_of(server).owns_recorder
        result, obs = _run(server.url)
        assert result.reward == 1.0, (obs.error, obs.verify_output)
        location = obs.records
        assert location is not None
        assert location.recorder_url == recorder.url and location.proxy_path is None
        records = fetch_records(location, token, server.url)  # no proxy: goes to the trainer's recorder
        assert len(records) == obs.trace.calls and records[0]["metadata"]["session_id"] == obs.session_id
        assert [s["session_id"] for s in httpx.get(f"{recorder.url}/admin/sessions", timeout=30,
                                                   headers={"authorization": f"Bearer {token}"}).json()] \
            == [obs.session_id]
        # this server has no recorder of its own to forward to
        proxied = httpx.get(f"{server.url}/recorder/admin/health", headers={"authorization": f"Bearer {token}"})
        assert proxied.status_code == 404 and "external recorder" in proxied.text
    finally:
        server.stop()
        recorder.stop()
