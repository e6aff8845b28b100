"""Bad input gets a clear error and leaves the server (and the session) usable.

None of these start an agent: each request is refused before one would be launched.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
import websockets.sync.client
from harness_env import HarnessEnv, RunAgent
from openenv.core import GenericEnvClient
from pydantic import ValidationError

from openenv_harness.recorder import ThreadedServer

from env_support import ADMIN


def _ws_url(server: ThreadedServer) -> str:
    return server.url.replace("http://", "ws://") + "/ws"


def test_unknown_task_is_a_clear_error_and_the_session_survives(env_server: ThreadedServer) -> None:
    with HarnessEnv(base_url=env_server.url).sync() as env:
        with pytest.raises(RuntimeError, match=r"unknown task 'nope'; known tasks: fix-add, .*give-up, slow"):
            env.reset(task_id="nope")
        state = env.state()  # the same WebSocket session still answers
        assert state.phase == "idle" and state.session_id is None
        with pytest.raises(RuntimeError, match="no episode is running: call reset"):
            env.step(RunAgent(timeout_s=5))
    assert httpx.get(f"{env_server.url}/health", timeout=10).json()["status"] == "healthy"
    with HarnessEnv(base_url=env_server.url).sync() as again:  # and new sessions are accepted
        assert again.state().phase == "idle"


@pytest.mark.parametrize(("options", "message"), [
    ({"task_id": "fix-add", "harness": "gemini"},
     r"unknown harness 'gemini'; known harnesses: claude-code, codex, gemini-cli, mini-swe-agent, opencode, pi"),
    ({"taskid": "fix-add"}, r"unknown reset option\(s\) taskid; accepted: seed, episode_id, task_id"),
    ({"task_id": 3}, r"task_id must be a string"),
    ({"seed": -1}, r"seed must be a non-negative integer"),
    ({"task_id": "fix-add", "episode_id": 7}, r"episode_id must be a non-empty string"),
    ({"split": "train", "index": 99}, r"task index 99 is out of range"),
    ({"split": "test", "index": 0}, r"unknown split 'test'"),
    ({"task_id": "fix-add", "index": 0}, r"either task_id or split \+ index"),
    ({"task_id": "fix-add", "budgets": {"max_agent_calls": -1}}, r"invalid budgets"),
    ({"task_id": "fix-add", "budgets": {"max_calories": 3}}, r"invalid budgets"),
])
def test_bad_reset_options_are_refused_before_anything_starts(env_server: ThreadedServer, options: dict,
                                                              message: str) -> None:
    with HarnessEnv(base_url=env_server.url).sync() as env:
        with pytest.raises(RuntimeError, match=message):
            env.reset(**options)
        assert env.state().phase == "idle"


def test_a_missing_agent_cli_is_named_with_the_fix(env_server: ThreadedServer, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENENV_HARNESS_NODE_PREFIX", str(tmp_path / "empty-prefix"))
    with HarnessEnv(base_url=env_server.url).sync() as env:
        with pytest.raises(RuntimeError, match=r"the pi CLI is not installed at .*empty-prefix.*"
                                               r"python -m openenv_harness.harnesses.install pi"):
            env.reset(task_id="fix-add", harness="pi")


def test_malformed_actions_get_validation_errors_on_the_wire(env_server: ThreadedServer) -> None:
    with websockets.sync.client.connect(_ws_url(env_server)) as ws:
        for data in ({"timeout_s": -1}, {"timeout_s": "soon"}, {"command": "ls"}):
            ws.send(json.dumps({"type": "step", "data": data}))
            reply = json.loads(ws.recv(timeout=30))
            assert reply["type"] == "error" and reply["data"]["code"] == "VALIDATION_ERROR", reply
            assert [e["loc"] for e in reply["data"]["errors"]] == [[next(iter(data))]]  # the bad field, by name
        ws.send(json.dumps({"type": "state"}))  # still serving this session
        assert json.loads(ws.recv(timeout=30))["data"]["phase"] == "idle"
    with pytest.raises(ValidationError):
        RunAgent(timeout_s=0)  # and the client's own model refuses it before sending


def test_task_discovery_through_openenv_task_api(env_server: ThreadedServer) -> None:
    base = f"{env_server.url}/harness_env"
    assert httpx.get(f"{base}/splits", timeout=30).json() == [{"name": "train", "type": "train"}]
    tasks = httpx.post(f"{base}/tasks", json={"split": "train"}, timeout=30).json()["tasks"]
    assert [t["id"] for t in tasks] == ["fix-add", "fix-wordcount", "write-greeting", "fix-range-sum",
                                        "give-up", "slow"]
    assert [t["index"] for t in tasks] == list(range(len(tasks)))
    assert tasks[0]["files"] == ["calc.py", "test_calc.py"] and tasks[0]["scored"] is True
    assert httpx.post(f"{base}/num_tasks", json={"split": "train"}, timeout=30).json() == {"num_tasks": 6}
    assert httpx.post(f"{base}/task", json={"split": "train", "index": 3}, timeout=30).json()["task"]["id"] \
        == "fix-range-sum"
    out_of_range = httpx.post(f"{base}/task", json={"split": "train", "index": 99}, timeout=30)
    assert out_of_range.status_code == 400
    schema = httpx.get(f"{env_server.url}/schema", timeout=30).json()
    assert "timeout_s" in schema["action"]["properties"]
    assert {"trace", "records", "exit_code"} <= set(schema["observation"]["properties"])
    assert schema["state"]["properties"]["phase"]["enum"] == ["idle", "running", "done"]
    assert httpx.get(f"{env_server.url}/metadata", timeout=30).json()["name"] == "harness_env"


def test_recorder_admin_routes_through_the_env_server_keep_the_recorder_auth(env_server: ThreadedServer) -> None:
    proxy = f"{env_server.url}/recorder/admin"
    assert httpx.get(f"{proxy}/health", timeout=30).status_code == 401  # no token, no records
    assert httpx.get(f"{proxy}/health", headers={"authorization": "Bearer wrong-token-0000000000"},
                     timeout=30).status_code == 401
    auth = {"authorization": f"Bearer {ADMIN}"}
    health = httpx.get(f"{proxy}/health", headers=auth, timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    missing = httpx.get(f"{proxy}/sessions/r-missing/records", headers=auth, timeout=30)
    assert missing.status_code == 404 and "r-missing" in missing.text
    escape = httpx.get(f"{proxy}/%2e%2e/v1/models", headers=auth, timeout=30)
    assert escape.status_code == 400 and "invalid recorder path" in escape.text


# -- the stateless HTTP routes: every error is a 4xx (or a 503 naming the server's fault) with the reason


def test_http_step_before_reset_is_a_409_that_explains_the_stateless_routes(env_server: ThreadedServer) -> None:
    r = httpx.post(f"{env_server.url}/step", json={"action": {}}, timeout=30)
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["error"] == "no_episode" and body["detail"].startswith("no episode is running: call reset() first")
    assert "stateless" in body["detail"] and "/ws" in body["detail"]


def test_http_reset_with_an_unknown_task_is_a_404_naming_the_known_tasks(env_server: ThreadedServer) -> None:
    r = httpx.post(f"{env_server.url}/reset", json={"task_id": "nope"}, timeout=30)
    assert r.status_code == 404, r.text
    assert r.json() == {"error": "unknown_task",
                        "detail": "unknown task 'nope'; known tasks: fix-add, fix-wordcount, write-greeting, "
                                  "fix-range-sum, give-up, slow"}


@pytest.mark.parametrize(("body", "status", "reason"), [
    ({"task_id": "fix-add", "harness": "gemini"}, 400,
     r"unknown harness 'gemini'; known harnesses: claude-code, codex, gemini-cli, mini-swe-agent, opencode, pi"),
    ({"taskid": "fix-add"}, 400, r"unknown reset option\(s\) taskid; accepted: seed, episode_id, task_id"),
    ({"task_id": 3}, 400, r"task_id must be a string"),
    ({"split": "train", "index": 99}, 404, r"task index 99 is out of range"),
    ({"split": "test", "index": 0}, 404, r"unknown split 'test'"),
    ({"split": "train"}, 400, r"split needs an index"),
    ({"task_id": "fix-add", "index": 0}, 400, r"either task_id or split \+ index"),
    ({"task_id": "fix-add", "budgets": []}, 400, r"budgets must be an object"),
    ({"task_id": "fix-add", "budgets": {"max_agent_calls": -1}}, 400, r"invalid budgets"),
    ({"task_id": "fix-add", "budgets": {"max_calories": 3}}, 400, r"invalid budgets.*max_calories"),
])
def test_http_reset_errors_carry_their_status_and_reason(env_server: ThreadedServer, body: dict, status: int,
                                                         reason: str) -> None:
    r = httpx.post(f"{env_server.url}/reset", json=body, timeout=30)
    assert r.status_code == status, r.text
    assert re.search(reason, r.json()["detail"]), r.json()


@pytest.mark.parametrize(("body", "field"), [
    ({"seed": -1}, ["body", "seed"]),
    ({"episode_id": 7}, ["body", "episode_id"]),
])
def test_http_reset_request_fields_are_validated_by_name(env_server: ThreadedServer, body: dict,
                                                         field: list) -> None:
    r = httpx.post(f"{env_server.url}/reset", json=body, timeout=30)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == field, r.text


@pytest.mark.parametrize(("action", "field"), [
    ({"timeout_s": -1}, ["timeout_s"]),
    ({"timeout_s": "soon"}, ["timeout_s"]),
    ({"command": "ls"}, ["command"]),
    ("run", ["body", "action"]),
])
def test_http_malformed_actions_name_the_bad_field(env_server: ThreadedServer, action: object, field: list) -> None:
    r = httpx.post(f"{env_server.url}/step", json={"action": action}, timeout=30)
    assert r.status_code == 422, r.text
    assert [e["loc"] for e in r.json()["detail"]] == [field]


def test_a_missing_cli_over_http_is_a_503_with_the_fix(env_server: ThreadedServer, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENENV_HARNESS_NODE_PREFIX", str(tmp_path / "empty-prefix"))
    r = httpx.post(f"{env_server.url}/reset", json={"task_id": "fix-add", "harness": "pi"}, timeout=30)
    assert r.status_code == 503 and r.json()["error"] == "backend_unavailable"
    assert "python -m openenv_harness.harnesses.install pi" in r.json()["detail"]


def test_openenv_generic_client_gets_the_reasons(env_server: ThreadedServer) -> None:
    with GenericEnvClient(base_url=env_server.url).sync() as env:
        with pytest.raises(RuntimeError, match=r"unknown task 'nope'; known tasks: fix-add"):
            env.reset(task_id="nope")
        with pytest.raises(RuntimeError, match=r"no episode is running: call reset\(\) first"):
            env.step({})
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            env.step({"timeout_s": -1})
        assert env.state()["phase"] == "idle"
