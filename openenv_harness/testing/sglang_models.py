"""Payloads held to SGLang 0.5.23's own classes, from the project's Python.

SGLang's request and reply models import only with torch, transformers and msgspec, so they are not
imported here: ``check_sglang_payloads`` runs ``sglang_models_check.py`` with the engine venv's Python,
SGLang's sources (``python -m openenv_harness.engine protocols``, run by ``./dev setup``) first on the
path, and returns its verdicts. ``SGLANG_ROUTE_KINDS`` says which kinds a route's request and reply are.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from openenv_harness.engine.protocols import sglang_deps_path, sglang_protocol_path
from openenv_harness.engine.setup import engine_home, engine_python

CHECKER = Path(__file__).with_name("sglang_models_check.py")

#: each SGLang route the recorder may call: (request kind, reply kind or None where the reply is not checked)
SGLANG_ROUTE_KINDS: dict[str, tuple[str, str | None]] = {
    "/v1/chat/completions": ("chat_request", "chat_response"),
    "/generate": ("generate_request", "generate_response"),
    "/v1/tokenize": ("tokenize_request", "tokenize_response"),
    "/tokenize": ("tokenize_request", "tokenize_response"),
    "/v1/detokenize": ("detokenize_request", "detokenize_response"),
    "/detokenize": ("detokenize_request", "detokenize_response"),
    "/parse_function_call": ("parse_function_call_request", "parse_function_call_response"),
    "/separate_reasoning": ("separate_reasoning_request", "separate_reasoning_response"),
    "/pause_generation": ("pause_generation_request", "pause_generation_response"),
    "/continue_generation": ("continue_generation_request", "continue_generation_response"),
    "/update_weights_from_disk": ("update_weights_from_disk_request", "update_weights_from_disk_response"),
    "/update_weight_version": ("update_weight_version_request", "update_weight_version_response"),
}


class SGLangModelsUnavailable(RuntimeError):
    """SGLang's sources or the interpreter that imports them are not installed here."""


def _interpreter() -> tuple[Path, dict[str, str]]:
    python = engine_python(engine_home())
    sources, deps = sglang_protocol_path(), sglang_deps_path()
    if not python.is_file() or sources is None or deps is None:
        missing = "the engine venv" if not python.is_file() else "SGLang 0.5.23's sources"
        raise SGLangModelsUnavailable(f"{missing} not installed: run ./dev setup (python -m openenv_harness.engine "
                                      "setup, then python -m openenv_harness.engine protocols)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(sources), str(deps)])
    return python, env


def check_sglang_payloads(items: list[dict[str, Any]], timeout_s: float = 300.0) -> list[dict[str, Any]]:
    """One verdict per ``{"kind", "payload"}`` item: ``{"kind", "ok", "error", "unknown", "missing"}``.

    Raises ``SGLangModelsUnavailable`` (run ``./dev setup``) where SGLang's classes cannot be imported
    here, and ``RuntimeError`` with the checker's error where it failed as a whole.
    """
    python, env = _interpreter()
    done = subprocess.run([str(python), str(CHECKER)], input=json.dumps(items), capture_output=True, text=True,
                          env=env, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"the SGLang checker failed: {done.stderr[-3000:]}")
    results: list[dict[str, Any]] = json.loads(done.stdout)["results"]
    return results


__all__ = ["SGLANG_ROUTE_KINDS", "SGLangModelsUnavailable", "check_sglang_payloads"]
