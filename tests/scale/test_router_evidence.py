"""A router that loses token evidence is caught: the call is recorded untrainable with the missing
field named, and ``doctor`` fails its evidence check. The real vllm-router keeps every field
(``test_router.py``); this one is a test double in front of it that drops a field."""

from __future__ import annotations

from pathlib import Path

import pytest

from openenv_harness.cli.cmd_doctor import _engine_checks
from openenv_harness.engine.router import VLLMRouter
from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.serving import ThreadedServer
from openenv_harness.testing.engine import EngineServer

from agentloop import ADMIN, run_agent, tool_script
from stripping_proxy import stripping_proxy


def _names(field: str, text: str) -> bool:
    """The message names the missing field (``prompt_token_ids`` or "prompt token ids")."""
    return field in text or field.replace("_", " ") in text


@pytest.mark.parametrize("dropped", ["prompt_token_ids", "token_ids"])
def test_a_router_that_drops_token_ids_leaves_untrainable_records(
        tmp_path: Path, router: VLLMRouter, replicas: list[EngineServer], dropped: str) -> None:
    with ThreadedServer(stripping_proxy(router.url, (dropped,))) as proxy:
        config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=proxy.url, admin_token=ADMIN,
                                probe_template=False, probe_logprobs_mode=False)
        with RecorderServer(config) as recorder, RecorderClient(recorder.url, ADMIN) as admin:
            s = admin.create_session()
            for engine in replicas:
                engine.set_script(s["session_id"], tool_script(0))
            run_agent(s["base_url"], s["secret"], stream=False, echo="pi")
            [record] = admin.records(s["session_id"])
            assert record["metadata"]["status"] == "invalid"
            assert record["metadata"]["trainable"] is False
            reasons = record["metadata"]["invalid_reasons"]
            assert any(_names(dropped, r) for r in reasons), reasons
            assert admin.training_trace_json(s["session_id"])["turns"] == []
        checks = {name: (ok, detail) for name, ok, detail in _engine_checks(proxy.url, "reference-model")}
        ok, detail = checks["token ids + logprobs"]
        assert not ok and _names(dropped, detail), detail
        if dropped == "token_ids":  # the incremental mode's generate reply lost its ids too
            ok, detail = checks["scale-out token routes"]
            assert not ok and "token_ids" in detail and "dropped on the way" in detail, detail


def test_doctor_through_the_real_router_lists_its_workers_and_passes_the_token_routes(
        router: VLLMRouter, replicas: list[EngineServer]) -> None:
    checks = {name: (ok, detail) for name, ok, detail in _engine_checks(router.url, "reference-model")}
    ok, detail = checks["router"]
    assert ok and f"{len(replicas)} worker(s)" in detail and "engine_replicas" in detail
    assert all(e.url in detail for e in replicas)
    assert checks["token ids + logprobs"] == (True, "ok")
    assert checks["scale-out token routes"] == (True, "ok")
