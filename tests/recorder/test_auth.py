"""The auth matrix (D5): every route, every kind of key. Only /healthz is open."""

from __future__ import annotations

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderServer
from openenv_harness.testing.engine import EngineServer

from agentloop import ADMIN, tool_script

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ADMIN_ROUTES = [
    ("GET", "/admin/health"), ("GET", "/admin/sessions"), ("POST", "/admin/sessions"),
    ("GET", "/admin/sessions/{sid}"), ("POST", "/admin/sessions/{sid}/close"),
    ("GET", "/admin/sessions/{sid}/records"), ("GET", "/admin/sessions/{sid}/training_trace"),
    ("GET", "/admin/sessions/{sid}/wait"), ("POST", "/admin/engine/pause"), ("POST", "/admin/engine/resume"),
    ("POST", "/admin/fence/pause"), ("POST", "/admin/fence/resume"), ("GET", "/admin/fence"),
    ("POST", "/admin/policy_version"), ("GET", "/metrics"),
]


@pytest.fixture
def two_sessions(engine: EngineServer, admin: RecorderClient) -> tuple[dict, dict]:
    a, b = admin.create_session(), admin.create_session()
    for s in (a, b):
        engine.set_script(s["session_id"], tool_script(0))
    return a, b


def test_agent_routes_need_the_right_session_key(recorder: RecorderServer, two_sessions: tuple[dict, dict]) -> None:
    a, b = two_sessions
    url = recorder.url
    cases = [
        (f"/rollout/{a['session_id']}/v1/chat/completions", None, 401),
        (f"/rollout/{a['session_id']}/v1/chat/completions", "oeh-not-a-real-key", 401),
        (f"/rollout/{a['session_id']}/v1/chat/completions", b["secret"], 401),  # another session's key
        (f"/rollout/{a['session_id']}/v1/chat/completions", ADMIN, 401),  # the admin token is not an agent key
        ("/rollout/no-such-session/v1/chat/completions", a["secret"], 401),
        ("/v1/chat/completions", "oeh-not-a-real-key", 401),
        (f"/rollout/{a['session_id']}/v1/chat/completions", a["secret"], 200),
        ("/v1/chat/completions", b["secret"], 200),  # bare route: the key alone routes
    ]
    for path, key, expected in cases:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        r = httpx.post(url + path, json=CHAT, headers=headers, timeout=30)
        assert r.status_code == expected, (path, key and key[:8], r.text)
        if expected == 401:
            assert r.json()["error"]["type"] == "authentication_error"
    for route in (f"/rollout/{a['session_id']}/v1/models", "/v1/models"):
        assert httpx.get(url + route).status_code == 401
        assert httpx.get(url + route, headers={"authorization": "Bearer nope"}).status_code == 401
        ok = httpx.get(url + route, headers={"x-api-key": a["secret"]})
        assert ok.status_code == 200 and ok.json()["data"][0]["id"]


MESSAGES = {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "m", "input": "hi"}
DIALECT_ROUTES = [("/v1/responses", RESPONSES), ("/v1/messages", MESSAGES), ("/v1/messages/count_tokens", MESSAGES)]


def _error_type(path: str, body: dict) -> str:
    return body["error"]["type"] if path.endswith("responses") else (body["type"], body["error"]["type"])


@pytest.mark.parametrize("suffix, payload", DIALECT_ROUTES)
def test_dialect_routes_need_the_right_session_key(suffix: str, payload: dict, recorder: RecorderServer,
                                                   two_sessions: tuple[dict, dict]) -> None:
    a, b = two_sessions
    own = f"/rollout/{a['session_id']}{suffix}"
    refused = [
        (own, {}), (own, {"x-api-key": "oeh-not-a-real-key"}), (own, {"authorization": "Bearer oeh-not-a-real-key"}),
        (own, {"x-api-key": b["secret"]}), (own, {"authorization": f"Bearer {b['secret']}"}),  # another session's
        (own, {"x-api-key": ADMIN}), (own, {"authorization": f"Basic {a['secret']}"}),
        (f"/rollout/no-such-session{suffix}", {"x-api-key": a["secret"]}), (suffix, {"x-api-key": "oeh-nope"}),
    ]
    for path, headers in refused:
        r = httpx.post(recorder.url + path, json=payload, headers=headers, timeout=30)
        assert r.status_code == 401, (path, headers, r.text)
        expected = "authentication_error" if suffix.endswith("responses") else ("error", "authentication_error")
        assert _error_type(path, r.json()) == expected
    accepted = [(own, {"x-api-key": a["secret"]}), (own, {"authorization": f"Bearer {a['secret']}"}),
                (suffix, {"x-api-key": b["secret"]}), (suffix, {"authorization": f"Bearer {b['secret']}"})]
    for path, headers in accepted:  # Anthropic clients send x-api-key or a Bearer token; both route
        r = httpx.post(recorder.url + path, json=payload, headers=headers, timeout=30)
        assert r.status_code == 200, (path, headers, r.text)


def test_records_only_in_the_owning_session(recorder: RecorderServer, admin: RecorderClient,
                                            two_sessions: tuple[dict, dict]) -> None:
    a, b = two_sessions
    httpx.post(f"{recorder.url}/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {b['secret']}"})
    assert len(admin.records(b["session_id"])) == 1 and admin.records(a["session_id"]) == []


def test_every_admin_route_needs_the_admin_token(recorder: RecorderServer, two_sessions: tuple[dict, dict]) -> None:
    a, _ = two_sessions
    for method, path in ADMIN_ROUTES:
        url = recorder.url + path.format(sid=a["session_id"])
        for headers in ({}, {"authorization": f"Bearer {a['secret']}"}, {"authorization": "Bearer wrong-token-xxxxxxxx"}):
            r = httpx.request(method, url, headers=headers, json={"version": 1} if method == "POST" else None)
            assert r.status_code == 401, (method, path, headers, r.text)


def test_liveness_is_the_only_open_route_and_says_nothing(recorder: RecorderServer) -> None:
    r = httpx.get(recorder.url + "/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_secrets_are_stored_only_as_digests(recorder: RecorderServer, two_sessions: tuple[dict, dict]) -> None:
    import sqlite3

    a, b = two_sessions
    db = sqlite3.connect(recorder.config.store_path)
    dump = "\n".join(db.iterdump())
    assert a["secret"] not in dump and b["secret"] not in dump and ADMIN not in dump


def test_the_sdks_key_header_is_read_beside_another_schemes_authorization() -> None:
    """A proxy in front of the recorder may add ``Authorization: Basic ...``; the agent's own key header
    still opens its session, and a Bearer key still wins over it."""
    from openenv_harness.recorder.auth import bearer_token

    assert bearer_token({"authorization": "Basic dXNlcjpwdw==", "x-api-key": "oeh-key"}) == "oeh-key"
    assert bearer_token({"authorization": "Basic dXNlcjpwdw==", "x-goog-api-key": " g "}) == "g"
    assert bearer_token({"authorization": "Bearer b", "x-api-key": "a"}) == "b"
    assert bearer_token({"authorization": "Basic dXNlcjpwdw=="}) is None
    assert bearer_token({"authorization": "Bearer  "}) is None
