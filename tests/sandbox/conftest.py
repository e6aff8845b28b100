"""Fixtures shared by the sandbox tests."""

from __future__ import annotations

import pytest

from openenv_harness.testing.containers import require_default_image


@pytest.fixture(scope="session")
def container_image() -> str:
    """The container sandbox's default image. Its absence (or an engine that does not answer) fails
    the test rather than skipping it: ``./dev setup`` builds it, so a machine without it is a broken
    set-up, which a skip would hide."""
    try:
        return require_default_image()
    except AssertionError as exc:
        missing = str(exc)
    pytest.fail(f"the container sandbox tests cannot run: {missing}", pytrace=False)
