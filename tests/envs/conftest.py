"""Fixtures for the harness environment: its server on a real loopback port, its tasks, its CLI.

Shared constants and helpers live in ``env_support`` (importing it puts ``envs/`` on ``sys.path``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from env_support import ADMIN, EXTRA_TASKS, start_env_server
from harness_env.server.config import EnvServerConfig

from openenv_harness.recorder import ThreadedServer


@pytest.fixture(scope="session")
def tasks_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("env-tasks") / "tasks.json"
    path.write_text(json.dumps(EXTRA_TASKS))
    return path


@pytest.fixture(scope="session")
def pi_cli() -> Path:
    from openenv_harness.harnesses.install import ensure_installed

    return ensure_installed(["pi"])["pi"]


@pytest.fixture(scope="module")
def env_server(tmp_path_factory: pytest.TempPathFactory, tasks_file: Path) -> Iterator[ThreadedServer]:
    """The embedded deployment: recorder + reference engine inside the environment server."""
    config = EnvServerConfig.from_environ(
        {}, admin_token=ADMIN, data_dir=str(tmp_path_factory.mktemp("env-data")), tasks_file=str(tasks_file),
        max_concurrent_envs=4,
    )
    server = start_env_server(config)
    try:
        yield server
    finally:
        server.stop()
