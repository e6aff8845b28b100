"""What the container sandbox's tests need from the machine: an engine that answers and the image.

Why a failure and not a skip: ``./dev setup`` installs the engine and builds the image wherever the
suite runs, so a test that finds neither points at a broken set-up, which must not pass quietly.
"""

from __future__ import annotations

from openenv_harness.sandbox.container_engine import find_container_engine
from openenv_harness.sandbox.container_image import DEFAULT_IMAGE, image_present


def require_default_image() -> str:
    """The default image's tag; ``AssertionError`` saying what to run when it cannot be used."""
    engine = find_container_engine()
    if engine is None:
        raise AssertionError("no container engine is installed: run ./dev setup (it installs docker.io)")
    ok, detail = engine.available()
    if not ok:
        raise AssertionError(f"the container engine does not answer ({detail}): run ./dev setup (it starts dockerd)")
    if not image_present(engine, DEFAULT_IMAGE):
        raise AssertionError(f"the image {DEFAULT_IMAGE} is not built: python -m openenv_harness.sandbox.container_image")
    return DEFAULT_IMAGE
