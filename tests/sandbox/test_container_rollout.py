"""A Pi rollout in a container sandbox whose container dies under it: the rollout ends unscored, with
the container's state as the reason, never with reward 0 (a dead container judged nothing the policy
did); and a healthy one on the same stack gives reward 1 with the agent's URL on the container's
loopback, never the recorder's address."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from openenv_harness.harnesses.install import ensure_installed
from openenv_harness.recorder import RecorderConfig, RecorderServer
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.rollout.report import run_rollout
from openenv_harness.sandbox.container import ContainerSandbox
from openenv_harness.testing.engine import EngineServer, Script
from openenv_harness.testing.engine.config import EngineConfig

pytestmark = [pytest.mark.cli, pytest.mark.slow]
ADMIN = "container-rollout-admin-token-0123456789"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[EngineServer, RecorderServer]]:
    # each call waits 1.5 s before its first token: time to kill the container under a call in flight
    with EngineServer(EngineConfig(prefill_delay_s=1.5)) as engine:
        engine.set_script("ref-fix-add", Script(turns=BUILTIN_TASKS["fix-add"].reference_script))
        config = RecorderConfig(store_path=str(tmp_path / "records.db"), engine_url=engine.url, admin_token=ADMIN)
        with RecorderServer(config) as recorder:
            yield engine, recorder


def test_a_dead_container_leaves_the_rollout_unscored(stack: tuple[EngineServer, RecorderServer],
                                                     container_image: str) -> None:
    engine, recorder = stack
    binary = str(ensure_installed(["pi"])["pi"])
    boxes: list[ContainerSandbox] = []

    def make() -> ContainerSandbox:
        boxes.append(ContainerSandbox(image=container_image))
        return boxes[-1]

    factory = HarnessSessionFactory(harness="pi", recorder_url=recorder.url, admin_token=ADMIN, model="ref-fix-add",
                                    executable=binary, sandbox_factory=make)
    healthy, session = run_rollout(factory, "fix-add", timeout_s=180)
    assert session is not None
    try:
        assert (healthy.exit_code, healthy.reward, healthy.unscored_reason) == (0, 1.0, None), healthy
        models = session.sandbox.read_file(f"{session.sandbox.home}/.pi/agent/models.json").decode()
        assert "127.0.0.1" in models and recorder.url not in models
    finally:
        session.close()

    def kill_when_running() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(boxes) < 2:
            time.sleep(0.05)
        time.sleep(3.0)  # the agent is up and its first call waits on the engine
        subprocess.run(["docker", "kill", boxes[1].container_name], capture_output=True, check=False)

    killer = threading.Thread(target=kill_when_running, daemon=True)
    killer.start()
    report, session = run_rollout(factory, "fix-add", timeout_s=180)
    killer.join()
    assert session is not None
    try:
        assert report.reward is None, report
        assert report.unscored_reason is not None and boxes[1].container_name in report.unscored_reason, report
    finally:
        session.close()
