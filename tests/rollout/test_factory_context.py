"""Agents are told the engine's own context length (vLLM's ``max_model_len``), not a fixed guess."""

from __future__ import annotations

from pathlib import Path

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.rollout.factory import FALLBACK_CONTEXT_WINDOW, engine_context_window
from openenv_harness.testing.engine import EngineConfig, EngineServer

ADMIN = "admin-" + "c" * 32


def test_the_factory_reads_max_model_len_from_the_engine(tmp_path: Path) -> None:
    with EngineServer(EngineConfig(max_model_len=12288)) as engine:
        config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN)
        with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as client:
            assert client.health()["engine"]["max_model_len"] == 12288
            assert engine_context_window(client) == 12288
            # another upstream (a trainer's ModelStep) has no /v1/models to read
            assert engine_context_window(client, "white-box") == FALLBACK_CONTEXT_WINDOW


def test_without_an_engine_answer_the_fallback_is_used(tmp_path: Path) -> None:
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url="http://127.0.0.1:9", admin_token=ADMIN)
    with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as client:
        assert "max_model_len" not in client.health()["engine"]
        assert engine_context_window(client) == FALLBACK_CONTEXT_WINDOW
