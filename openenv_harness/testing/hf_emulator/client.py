"""Point the real ``huggingface_hub`` client at an ``HFEmulator``.

Why a helper: ``huggingface_hub`` reads ``HF_ENDPOINT`` once, at import, into
``constants.ENDPOINT`` and into the module-level ``hf_api.api``. Whether or not something imported
it first, this sets the environment *and* patches both, and restores everything on exit.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from openenv_harness.testing.hf_emulator.server import HFEmulator

_ENV_KEYS = ("HF_ENDPOINT", "HF_TOKEN", "HF_HOME", "HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN")


def client_environment(emulator: HFEmulator, hf_home: Path) -> dict[str, str]:
    """Environment for a subprocess that should use the emulator."""
    return {"HF_ENDPOINT": emulator.url, "HF_TOKEN": emulator.token, "HF_HOME": str(hf_home)}


@contextmanager
def hub_pointed_at(emulator: HFEmulator, hf_home: Path) -> Iterator[None]:
    """Within the block, ``huggingface_hub`` (imported or not yet) talks to ``emulator``."""
    saved_env = {key: os.environ.get(key) for key in _ENV_KEYS}
    for key in ("HF_HUB_OFFLINE", "HUGGING_FACE_HUB_TOKEN"):
        os.environ.pop(key, None)  # offline mode would block the Jobs API calls
    os.environ.update(client_environment(emulator, hf_home))
    patched: list[tuple[object, str, object]] = []
    try:
        constants = sys.modules.get("huggingface_hub.constants")
        if constants is None:
            from huggingface_hub import constants  # noqa: PLC0415 -- reads the env we just set
        patched.append((constants, "ENDPOINT", constants.ENDPOINT))
        constants.ENDPOINT = emulator.url
        hf_api = sys.modules.get("huggingface_hub.hf_api")
        if hf_api is not None:
            patched.append((hf_api.api, "endpoint", hf_api.api.endpoint))
            hf_api.api.endpoint = emulator.url
        yield
    finally:
        for owner, name, value in reversed(patched):
            setattr(owner, name, value)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
