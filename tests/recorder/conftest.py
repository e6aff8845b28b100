"""Recorder test fixtures: the reference engine and a recorder, both on real loopback HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineServer

from agentloop import ADMIN
from refused_bodies import LIMIT

@pytest.fixture(scope="module")
def engine() -> Iterator[EngineServer]:
    with EngineServer() as e:
        yield e


@pytest.fixture
def recorder(tmp_path: Path, engine: EngineServer) -> Iterator[RecorderServer]:
    config = RecorderConfig(store_path=str(tmp_path / "records.db"), engine_url=engine.url, admin_token=ADMIN)
    with RecorderServer(config) as server:
        yield server


@pytest.fixture
def small_recorder(tmp_path: Path, engine: EngineServer) -> Iterator[RecorderServer]:
    """A recorder with a 64 KiB request body limit, for the size-limit tests."""
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN,
                            max_body_bytes=LIMIT)
    with RecorderServer(config) as server:
        yield server


@pytest.fixture
def admin(recorder: RecorderServer) -> Iterator[RecorderClient]:
    with RecorderClient(recorder.url, ADMIN) as client:
        yield client
