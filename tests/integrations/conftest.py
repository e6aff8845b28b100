"""Fixtures for the verifiers bridge tests: the reference engine and a recorder on loopback HTTP."""

from __future__ import annotations

from typing import Iterator

import pytest
from recorded_sessions import ADMIN

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineServer


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineServer]:
    with EngineServer() as server:
        yield server


@pytest.fixture(scope="module")
def recorder(tmp_path_factory: pytest.TempPathFactory, engine: EngineServer) -> Iterator[RecorderServer]:
    store = tmp_path_factory.mktemp("integrations") / "records.db"
    with RecorderServer(RecorderConfig(store_path=str(store), engine_url=engine.url, admin_token=ADMIN)) as server:
        yield server


@pytest.fixture(scope="module")
def admin(recorder: RecorderServer) -> Iterator[RecorderClient]:
    with RecorderClient(recorder.url, ADMIN) as client:
        yield client
