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
from harness_env.models import RecordsLocation
from openenv.core import GenericEnvClient

from openenv_harness.recorder import RecorderConfig, RecorderServer, free_port
from openenv_harness.rollout import BUILTIN_TASKS
from openenv_harness.testing.engine import EngineServer, Script
from openenv_harness.testing.recorder_process import start_recorder_process

from env_support import ADMIN, backend_of, start_env_server
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


def test_episodes_spread_over_several_external_recorders_and_one_down_fails_only_its_own(
        engine: EngineServer, pi_cli: Path, tmp_path: Path) -> None:
    """``OEH_RECORDER_URL`` lists two recorders (each a process of its own, so one can be killed):
    two episodes open at once land on different ones, each episode's records are on the recorder
    that holds it, a killed recorder fails only its episode, clearly, and the next episode goes to
    the one still up. Driven through OpenEnv's generic client."""
    token = "trainer-owned-admin-token-000000"
    ports = [free_port(), free_port()]
    procs = [start_recorder_process(tmp_path / f"r{i}.db", engine.url, port, token) for i, port in enumerate(ports)]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    config = EnvServerConfig.from_environ({"OEH_RECORDER_URL": ",".join(urls), "OEH_ADMIN_TOKEN": token,
                                           "OEH_MODEL": MODEL})
    server = start_env_server(config)
    clients = [GenericEnvClient(base_url=server.url).sync() for _ in range(3)]
    try:
        first, second = (client.__enter__().reset(task_id="write-greeting", harness="pi").observation
                         for client in clients[:2])
        held = {first["records"]["recorder_url"]: first, second["records"]["recorder_url"]: second}
        assert set(held) == set(urls)  # least live sessions: the second episode went to the other recorder
        doomed_url = second["records"]["recorder_url"]
        survivor_url = first["records"]["recorder_url"]
        procs[urls.index(doomed_url)].kill()
        procs[urls.index(doomed_url)].wait(timeout=30)

        failed = clients[1].step({"timeout_s": 120}).observation
        assert failed["trace"] is None
        assert f"recorder {doomed_url} holding session {second['session_id']} is unreachable" in failed["error"]

        done = clients[0].step({"timeout_s": 120})
        assert done.reward == 1.0, (done.observation["error"], done.observation["verify_output"])
        assert done.observation["trace"]["agent_calls"] == 2
        records = fetch_records(RecordsLocation(**done.observation["records"]), token, server.url)
        assert {r["metadata"]["session_id"] for r in records} == {first["session_id"]}

        third = clients[2].__enter__().reset(task_id="write-greeting", harness="pi").observation
        assert third["records"]["recorder_url"] == survivor_url  # the killed recorder is skipped
        assert clients[2].step({"timeout_s": 120}).reward == 1.0
    finally:
        for client in clients:
            client.__exit__(None, None, None)
        server.stop()
        for proc in procs:
            proc.kill()
            proc.wait(timeout=30)


def test_every_external_recorder_down_refuses_reset_with_each_cause(engine: EngineServer, tmp_path: Path) -> None:
    token = "trainer-owned-admin-token-000000"
    urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]  # nothing listens there
    config = EnvServerConfig.from_environ({"OEH_RECORDER_URL": ",".join(urls), "OEH_ADMIN_TOKEN": token,
                                           "OEH_MODEL": MODEL})
    server = start_env_server(config)
    try:
        r = httpx.post(f"{server.url}/reset", json={"task_id": "write-greeting", "harness": "pi"}, timeout=60)
        assert r.status_code == 503 and r.json()["error"] == "backend_unavailable"
        assert "none of the 2 recorders answered" in r.json()["detail"]
        assert all(url in r.json()["detail"] for url in urls)
    finally:
        server.stop()
