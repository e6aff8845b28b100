"""What the real engine tier's tests share: its tokens and model name, starting a real vLLM, and
``RealStack`` (a recorder in front of it). Kept out of ``conftest.py`` so test modules import it by
a name unique across ``tests/``.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from openenv_harness.engine import VLLMServer, VLLMSettings, prepared_model_dir
from openenv_harness.engine.model import QWEN25_CODER_05B
from openenv_harness.engine.setup import engine_home, engine_python
from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer

ADMIN = "real-engine-admin-token-0123456789"
MODEL = QWEN25_CODER_05B.served_name
AGENT_CALLS = 3


def engine_parts() -> tuple[Path, Path]:
    home = engine_home()
    python, model = engine_python(home), prepared_model_dir(home, QWEN25_CODER_05B)
    if not python.is_file() or model is None:
        pytest.fail(f"the real engine is not installed under {home}: run ./dev setup "
                    "(or python -m openenv_harness.engine setup)", pytrace=False)
    return python, model


#: a reasoning template of today's families, served by a second real vLLM: TRL's Qwen3.5 think template
#: (training variant: it renders replayed reasoning on every turn; its generation prompt opens ``<think>``)
THINK_TEMPLATE = "qwen3_5_think_training.jinja"


def start_vllm(tmp: Path, **overrides: object) -> VLLMServer:
    python, model = engine_parts()
    settings = VLLMSettings(model_dir=model, served_name=MODEL, python=python,
                            max_model_len=QWEN25_CODER_05B.max_model_len, **overrides)  # type: ignore[arg-type]
    return VLLMServer(settings, log_path=tmp / "vllm.log").start(timeout_s=900)


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
