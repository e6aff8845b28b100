"""Shared fixtures: one reference engine per module on a real loopback port, reset between tests.

Helpers reach the tests as the ``wire`` fixture (never by importing this module, whose name other
test folders share).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from openenv_harness.testing.engine import EngineServer
from openenv_harness.testing.recorder_fixtures import engine_fixture

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    },
]

SYSTEM = {"role": "system", "content": "You are a coding agent. Use the tools."}
USER = {"role": "user", "content": [{"type": "text", "text": "Run ls and tell me what you see."}]}


def trl_template(name: str) -> Path:
    """One of the chat templates TRL ships, read from the installed package (never copied here)."""
    import trl

    path = Path(trl.__file__).parent / "chat_templates" / name
    assert path.is_file(), f"TRL {trl.__version__} ships no {name}"
    return path


@pytest.fixture(scope="session")
def qwen_folder() -> Path:
    """The real Qwen2.5-Coder-0.5B-Instruct folder vLLM serves (its tokenizer.json, chat template,
    generation config). ``./dev setup`` installs it; without it these tests fail, never skip --
    unless the real-engine parts were deselected on purpose with ``OEH_WITH_ENGINE=0``."""
    from openenv_harness.engine import engine_home, prepared_model_dir

    folder = prepared_model_dir(engine_home())
    if folder is None:
        if os.environ.get("OEH_WITH_ENGINE", "1") == "0":
            pytest.skip("OEH_WITH_ENGINE=0: the real model was deselected on purpose")
        pytest.fail(f"the real Qwen2.5 model is not installed under {engine_home()}: run ./dev setup "
                    "(or python -m openenv_harness.engine setup)", pytrace=False)
    return folder


engine = engine_fixture()


@pytest.fixture(autouse=True)
def _fresh_engine(request: pytest.FixtureRequest) -> None:
    if "engine" in request.fixturenames:
        request.getfixturevalue("engine").reset()


def _chat_body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A request body as a recorder sends it: tools, token ids and logprobs asked for."""
    body: dict[str, Any] = {"model": "reference-model", "messages": messages, "tools": TOOLS,
                            "return_token_ids": True, "logprobs": True, "top_logprobs": 0}
    body.update(extra)
    return body


def _post_chat(engine: EngineServer, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(engine.url + "/v1/chat/completions", json=body, headers=headers, timeout=30.0)


def _read_sse(engine: EngineServer, body: dict[str, Any], headers: dict[str, str] | None = None) -> list[Any]:
    """All ``data:`` payloads of a streamed reply (``"[DONE]"`` kept as a string)."""
    events: list[Any] = []
    with httpx.stream("POST", engine.url + "/v1/chat/completions", json={**body, "stream": True},
                      headers=headers, timeout=30.0) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            payload = line[len("data: "):]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


class Wire:
    """Constants and HTTP helpers shared by the engine tests."""

    trl_template = staticmethod(trl_template)
    TOOLS = TOOLS
    SYSTEM = SYSTEM
    USER = USER
    chat_body = staticmethod(_chat_body)
    post_chat = staticmethod(_post_chat)
    read_sse = staticmethod(_read_sse)


@pytest.fixture
def wire() -> type[Wire]:
    return Wire
