"""The real SGLang 0.5.23 (its CPU engine, torch-native path) started by ``SGLangServer`` on the real
Qwen2.5-Coder-0.5B-Instruct: it becomes ready, generates from token ids, and ``stop()`` leaves no process
of its group (HTTP server, scheduler, detokenizer) behind.

Installed by ``./dev setup`` (``python -m openenv_harness.engine sglang-setup``); where it is not, the
test fails with that command, it never skips silently."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from openenv_harness.engine import SGLangServer, SGLangSettings
from openenv_harness.engine.model import QWEN25_CODER_05B
from openenv_harness.engine.sglang_cpu import _group_alive, sglang_home, sglang_python
from openenv_harness.engine.setup import engine_home

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

#: "def add(a, b):" in Qwen2.5's vocabulary
PROMPT_IDS = [750, 912, 2877, 11, 293, 982]


def _sglang_parts() -> tuple[Path, Path]:
    home = engine_home()
    python, model = sglang_python(home), sglang_home(home) / "model" / QWEN25_CODER_05B.name
    if not python.is_file() or not (model / "config.json").is_file():
        pytest.fail(f"SGLang's CPU engine is not installed under {sglang_home(home)}: run ./dev setup "
                    "(or python -m openenv_harness.engine sglang-setup)", pytrace=False)
    return python, model


@pytest.fixture(scope="module")
def sglang(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SGLangServer]:
    python, model = _sglang_parts()
    server = SGLangServer(SGLangSettings(model_dir=model, python=python, nice=10),
                          log_path=tmp_path_factory.mktemp("sglang") / "sglang.log")
    try:
        yield server.start(timeout_s=600)
    finally:
        server.stop()


def test_sglang_serves_token_ids_and_stops_its_whole_group(sglang: SGLangServer) -> None:
    assert sglang.process is not None
    group = sglang.process.pid
    assert httpx.get(sglang.url + "/health_generate", timeout=120).status_code == 200
    reply = httpx.post(sglang.url + "/generate", timeout=300, json={
        "input_ids": PROMPT_IDS, "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert isinstance(body["output_ids"], list) and 0 < len(body["output_ids"]) <= 8
    assert all(isinstance(i, int) for i in body["output_ids"])
    assert body["meta_info"]["prompt_tokens"] == len(PROMPT_IDS)
    sglang.stop()
    assert sglang.process is None
    assert not _group_alive(group), "a process of SGLang's group outlived stop()"
    sglang.stop()  # idempotent
