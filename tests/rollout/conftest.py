"""Fixtures for rollouts with the real agent CLIs: reference engine + recorder on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from openenv_harness.harnesses.install import ensure_installed
from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineServer

from rollout_helpers import ADMIN


@pytest.fixture(scope="session")
def cli_paths() -> dict[str, Path]:
    return ensure_installed(["pi", "opencode", "codex", "claude-code"])


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
