"""Fixtures for rollouts with the real agent CLIs: reference engine + recorder on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from openenv_harness.harnesses.install import ensure_installed
from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.testing.engine import EngineServer, Script

ADMIN = "rollout-admin-token-0123456789abcdef"


@pytest.fixture(scope="session")
def cli_paths() -> dict[str, Path]:
    return ensure_installed(["pi", "opencode"])


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineServer]:
    with EngineServer() as e:
        yield e


@pytest.fixture(scope="module")
def recorder(tmp_path_factory: pytest.TempPathFactory, engine: EngineServer) -> Iterator[RecorderServer]:
    store = tmp_path_factory.mktemp("rollout") / "records.db"
    with RecorderServer(RecorderConfig(store_path=str(store), engine_url=engine.url, admin_token=ADMIN)) as server:
        yield server


@pytest.fixture
def admin(recorder: RecorderServer) -> Iterator[RecorderClient]:
    with RecorderClient(recorder.url, ADMIN) as c:
        yield c


def scripted_factory(engine: EngineServer, recorder: RecorderServer, harness: str, task_id: str, *,
                     segmentation: str = "canonical", script: Script | None = None, **kw) -> HarnessSessionFactory:
    """A factory whose model name selects the engine script solving ``task_id``."""
    model = f"ref-{harness}-{task_id}-{segmentation}"
    engine.set_script(model, script or Script(turns=BUILTIN_TASKS[task_id].reference_script, segmentation=segmentation))
    return HarnessSessionFactory(harness=harness, recorder_url=recorder.url, admin_token=ADMIN, model=model, **kw)
