"""The reference engine and a recorder in front of it, as pytest fixtures: one definition for every
test tier, each tier choosing the scope and the settings it needs.

Why a maker and not one fixture: a tier of short tests wants a fresh recorder per test (its metrics,
its store), a tier of agent rollouts one per module (an agent CLI's start costs seconds), the scale
tier one in front of a router instead of an engine. The recorder is always the real ``RecorderServer``
on loopback HTTP with its SQLite store in the test's (or the module's) temporary folder.

    engine = engine_fixture()
    recorder = recorder_fixture(ADMIN, scope="module")
    admin = admin_fixture(ADMIN, scope="module")
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Literal

import pytest

from openenv_harness.recorder.client import RecorderClient
from openenv_harness.recorder.config import RecorderConfig
from openenv_harness.recorder.server import RecorderServer
from openenv_harness.testing.engine import EngineServer

Scope = Literal["function", "module", "session"]


def engine_fixture(*, scope: Scope = "module") -> Callable[..., Any]:
    """The reference engine (``testing/engine``) on loopback HTTP, shared by ``scope``."""

    @pytest.fixture(scope=scope, name="engine")
    def engine() -> Iterator[EngineServer]:
        with EngineServer() as server:
            yield server

    return engine


def recorder_fixture(admin_token: str, *, name: str = "recorder", scope: Scope = "function",
                     engine: str = "engine", **config: Any) -> Callable[..., Any]:
    """A fixture ``name``: a recorder whose engine is the fixture ``engine`` (anything with a ``url``:
    the reference engine, a router), with ``config`` over the defaults."""

    @pytest.fixture(scope=scope, name=name)
    def recorder(request: pytest.FixtureRequest,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecorderServer]:
        upstream = request.getfixturevalue(engine)
        folder = request.getfixturevalue("tmp_path") if scope == "function" else tmp_path_factory.mktemp(name)
        settings = RecorderConfig(store_path=str(folder / f"{name}-records.db"), engine_url=upstream.url,
                                  admin_token=admin_token, **config)
        server = RecorderServer(settings)
        with server:
            yield server

    return recorder


def admin_fixture(admin_token: str, *, recorder: str = "recorder", scope: Scope = "function") -> Callable[..., Any]:
    """A fixture ``admin``: the trainer's client of the fixture ``recorder``."""

    @pytest.fixture(scope=scope, name="admin")
    def admin(request: pytest.FixtureRequest) -> Iterator[RecorderClient]:
        server: RecorderServer = request.getfixturevalue(recorder)
        with RecorderClient(server.url, admin_token) as client:
            yield client

    return admin
