"""Bad input gets a clear 4xx, nothing is recorded wrongly, and the server stays up."""

from __future__ import annotations

import httpx

from openenv_harness.recorder import RecorderClient, RecorderServer
from openenv_harness.testing.engine import EngineServer

from agentloop import ADMIN, tool_script
from refused_bodies import REFUSED



def test_malformed_requests(small_recorder: RecorderServer, engine: EngineServer) -> None:
    with RecorderClient(small_recorder.url, ADMIN) as admin:
        s = admin.create_session()
        engine.set_script(s["session_id"], tool_script(0))
        url = f"{s['base_url']}/chat/completions"
        auth = {"authorization": f"Bearer {s['secret']}", "content-type": "application/json"}
        for body, status, code in REFUSED:
            r = httpx.post(url, content=body, headers=auth)
            assert r.status_code == status, (body[:40], r.text)
            assert r.json()["error"]["code"] == code
        # chunked body past the limit (no content-length): still 413
        r = httpx.post(url, content=iter([b'{"messages":[{"role":"user","content":"', b"y" * 70_000, b'"}]}']), headers=auth)
        assert r.status_code == 413
        assert admin.records(s["session_id"]) == []  # nothing reached the engine, nothing recorded
        # unknown routes and methods: JSON errors
        assert httpx.get(small_recorder.url + "/nope").status_code == 404
        assert httpx.get(url, headers=auth).status_code == 405
        # every dialect's call path refuses another method the same way, before any routing
        for path in ("/v1/messages", "/v1/responses", "/v1beta/models/policy:generateContent"):
            refused = httpx.put(small_recorder.url + path, headers=auth)
            assert refused.status_code == 405, path
            assert refused.json()["error"]["code"] == "method_not_allowed"
        assert httpx.get(small_recorder.url + "/v1beta/models/policy:countTokens").status_code == 405
        # the engine rejects what it cannot serve (a 400 from the engine); recorded as a failed call
        r = httpx.post(url, json={"messages": [{"role": "user", "content": "x"}], "max_tokens": -5}, headers=auth)
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("engine:")
        # and the server is still fine
        r = httpx.post(url, json={"model": "reference-model", "messages": [{"role": "user", "content": "x"}]}, headers=auth)
        assert r.status_code == 200
        recs = admin.records(s["session_id"])
        assert [r["metadata"]["status"] for r in recs] == ["failed", "ok"]
        assert recs[0]["metadata"]["error"]["upstream_status"] == 400


def test_bad_admin_input(small_recorder: RecorderServer) -> None:
    with RecorderClient(small_recorder.url, ADMIN) as admin:
        h = {"authorization": f"Bearer {ADMIN}"}
        u = small_recorder.url
        assert httpx.post(u + "/admin/sessions", json={"budgets": {"max_agent_calls": -1}}, headers=h).status_code == 422
        assert httpx.post(u + "/admin/sessions", json={"unknown_field": 1}, headers=h).status_code == 422
        assert httpx.post(u + "/admin/sessions", json={"session_id": "bad id!"}, headers=h).status_code == 422
        admin.create_session(session_id="fixed-1")
        assert httpx.post(u + "/admin/sessions", json={"session_id": "fixed-1"}, headers=h).status_code == 409
        assert httpx.get(u + "/admin/sessions/none/records", headers=h).status_code == 404
        assert httpx.get(u + "/admin/sessions/fixed-1/records?format=xml", headers=h).status_code == 422


def test_error_shapes_name_the_problem(small_recorder: RecorderServer) -> None:
    h = {"authorization": f"Bearer {ADMIN}"}
    missing = httpx.get(small_recorder.url + "/admin/sessions/none", headers=h)
    assert missing.status_code == 404 and "no session 'none'" in missing.json()["error"]["message"]
    bad = httpx.post(small_recorder.url + "/admin/sessions", json={"budgets": {"max_agent_calls": -1}}, headers=h)
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "validation_error"
    assert "max_agent_calls" in bad.json()["error"]["message"]
