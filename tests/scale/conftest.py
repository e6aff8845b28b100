"""Scale-out fixtures: reference engine replicas behind the real vllm-router, on loopback HTTP.

The router is the PyPI ``vllm-router`` binary (the ``scale`` extra); the replicas are reference
engines (``EngineServer``), whose request logs say which replica served each call. The recorder
tests' agent loop (``tests/recorder/agentloop.py``) drives the sessions.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

from openenv_harness.engine.router import VLLMRouter
from openenv_harness.testing.engine import EngineServer

RECORDER_TESTS = Path(__file__).resolve().parent.parent / "recorder"
if str(RECORDER_TESTS) not in sys.path:
    sys.path.insert(0, str(RECORDER_TESTS))


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[EngineServer]]:
    engines = [EngineServer().start() for _ in range(3)]
    try:
        yield engines
    finally:
        for engine in engines:
            engine.stop()


@pytest.fixture(scope="module")
def router(replicas: list[EngineServer], tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMRouter]:
    log = tmp_path_factory.mktemp("router") / "router.log"
    with VLLMRouter([e.url for e in replicas], log_path=log) as r:
        yield r


@pytest.fixture(autouse=True)
def _fresh_replicas(replicas: list[EngineServer]) -> None:
    for engine in replicas:
        engine.reset()
