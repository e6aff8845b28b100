"""Fixtures for rollouts with the real agent CLIs: reference engine + recorder on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from openenv_harness.harnesses.install import ensure_installed
from openenv_harness.testing.recorder_fixtures import admin_fixture, engine_fixture, recorder_fixture

from rollout_helpers import ADMIN


@pytest.fixture(scope="session")
def cli_paths() -> dict[str, Path]:
    return ensure_installed(["pi", "opencode", "codex", "claude-code"])


engine = engine_fixture()
recorder = recorder_fixture(ADMIN, scope="module")
admin = admin_fixture(ADMIN)
