"""Helpers for the verifiers bridge tests: real recorded sessions, and a runner for verifiers' side.

Records come from the recorder in front of the reference engine, driven by a scripted agent loop
speaking like the real CLIs (tools, echoed history, tool results). verifiers cannot live next to
OpenEnv (``mcp`` pins conflict), so its part runs in ``.venv-verifiers`` as a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from openenv_harness.recorder import RecorderClient
from openenv_harness.testing.engine import EngineServer, Script, ToolCallSpec, Turn, agent_echo

ROOT = Path(__file__).resolve().parents[2]
VERIFIERS_PYTHON = ROOT / ".venv-verifiers" / "bin" / "python"
ADMIN = "integrations-admin-token-0123456789"
SYSTEM = "You are a careful coding agent."
TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
                                      "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                     "required": ["command"]}}},
]


def verifiers_python() -> Path:
    """The verifiers environment's interpreter; skips the test when that environment is absent."""
    if not VERIFIERS_PYTHON.is_file():
        pytest.skip(
            f"{VERIFIERS_PYTHON} not found: create it with `python3 -m venv .venv-verifiers && "
            ".venv-verifiers/bin/pip install verifiers==0.4.0 && .venv-verifiers/bin/pip install --no-deps -e .`"
        )
    return VERIFIERS_PYTHON


def run_verifiers(args: list[str], *, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run ``args`` with the verifiers environment's Python from the repository root."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(verifiers_python()), *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout_s, check=False)


def tool_script(steps: int, *, spaced_args: bool = False, segmentation: str = "canonical") -> Script:
    """``steps`` bash calls, then a final answer. ``spaced_args`` samples odd spacing that neither the
    agent's re-serialization nor the engine's re-rendering of it (vLLM parses replayed arguments) gives back."""
    turns = []
    for i in range(steps):
        arguments: Any = '{"command":  "echo step %d"}' % i if spaced_args else {"command": f"echo step {i}"}
        turns.append(Turn(content=f"Running step {i}." if i % 2 == 0 else None,
                          tool_calls=[ToolCallSpec(name="bash", arguments=arguments)]))
    turns.append(Turn(content="All done."))
    return Script(turns=turns, segmentation=segmentation)  # type: ignore[arg-type]


class Agent:
    """A scripted agent loop over one recorder session (non-streaming, like a CLI with streaming off)."""

    def __init__(self, base_url: str, secret: str, model: str, *, echo: str = "opencode",
                 rename_tool_ids: bool = False) -> None:
        self.base_url = base_url
        self.model = model
        self.echo = echo
        self.rename_tool_ids = rename_tool_ids
        self.renamed = 0
        self.http = httpx.Client(timeout=60, headers={"authorization": f"Bearer {secret}"})

    def close(self) -> None:
        self.http.close()

    def call(self, messages: list[dict[str, Any]], *, tools: bool = True) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": 512}
        if tools:
            body["tools"] = TOOLS
        response = self.http.post(f"{self.base_url}/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]

    def _echo(self, message: dict[str, Any]) -> dict[str, Any]:
        echoed = agent_echo(message, self.echo)  # type: ignore[arg-type]
        if self.rename_tool_ids:
            for call in echoed.get("tool_calls") or []:
                call["id"] = f"call_{self.renamed}"  # an SDK normalising ids; the template never renders them
                self.renamed += 1
        return echoed

    def run(self, messages: list[dict[str, Any]], max_turns: int = 20) -> list[dict[str, Any]]:
        """Call the model until it answers without tools; return the history including that answer."""
        for _ in range(max_turns):
            message = self.call(messages)
            echoed = self._echo(message)
            messages = messages + [echoed]
            if not message.get("tool_calls"):
                return messages
            for call in echoed["tool_calls"]:
                result = f"ran {call['function']['name']}\n"
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        raise AssertionError("the scripted agent did not finish")


def opening(task: str = "Do the task step by step.") -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]


class SessionRun:
    """One recorded session: open it, drive agents in it, then read its records."""

    def __init__(self, admin: RecorderClient, engine: EngineServer, model: str, script: Script) -> None:
        engine.set_script(model, script)
        self.admin = admin
        self.model = model
        self.session = admin.create_session(harness="opencode")
        self.session_id: str = self.session["session_id"]

    def agent(self, **kw: Any) -> Agent:
        return Agent(self.session["base_url"], self.session["secret"], self.model, **kw)

    def records(self) -> list[dict[str, Any]]:
        self.admin.close_session(self.session_id)
        return self.admin.records(self.session_id)


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path

