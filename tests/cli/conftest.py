from __future__ import annotations

import pytest

from openenv_harness.testing.containers import require_default_image


@pytest.fixture(scope="session")
def container_image() -> str:
    """The container sandbox's default image (the test fails if set-up did not build it)."""
    return require_default_image()
