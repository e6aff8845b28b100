"""Provenance on every record (D11) and the served-template fingerprint check (D3)."""

from __future__ import annotations

import httpx
import pytest

from openenv_harness.recorder import RecorderAPIError, RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.engine_knowledge.provenance import PROBES, fingerprint_ids
from openenv_harness.testing.engine import ENGINE_VERSION, EngineServer
from openenv_harness.version import __version__

from agentloop import ADMIN, TOOLS, tool_script


def engine_fingerprint(engine: EngineServer) -> str:
    ids = []
    for probe in PROBES:
        body = {k: v for k, v in probe.items()}
        ids.append(httpx.post(engine.url + "/tokenize", json=body).json()["tokens"])
    return fingerprint_ids(ids)


def test_every_record_carries_provenance(engine: EngineServer, recorder: RecorderServer, admin: RecorderClient) -> None:
    hashes = {"/home/agent/.config/opencode/opencode.json": "ab" * 32}
    s = admin.create_session(harness="opencode", harness_version="1.18.33", config_hashes=hashes,
                             sampling={"temperature": 1.0, "top_p": 1.0})
    engine.set_script(s["session_id"], tool_script(0))
    httpx.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
               json={"model": "reference-model", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS,
                     "max_tokens": 64, "temperature": 0.2})
    prov = admin.records(s["session_id"])[0]["metadata"]["provenance"]
    assert prov["engine_version"] == ENGINE_VERSION and prov["recorder_version"] == __version__
    assert prov["harness"] == "opencode" and prov["harness_version"] == "1.18.33"
    assert prov["config_hashes"] == hashes and prov["model"] == "reference-model"
    # the sampling actually sent: the trainer's pinned temperature wins over the agent's
    assert prov["sampling"]["temperature"] == 1.0 and prov["sampling"]["top_p"] == 1.0
    assert prov["sampling"]["max_tokens"] == 64 and prov["sampling"]["return_token_ids"] is True
    assert engine.requests(s["session_id"])[0]["body"]["temperature"] == 1.0
    assert prov["template_status"] == "probed" and prov["template_fingerprint"] == engine_fingerprint(engine)


def test_template_mismatch_fails_session_creation(engine: EngineServer, recorder: RecorderServer,
                                                  admin: RecorderClient) -> None:
    with pytest.raises(RecorderAPIError) as err:
        admin.create_session(trainer_template_fingerprint="tpl1-" + "0" * 64)
    assert err.value.status == 409 and "differs" in err.value.message
    ok = admin.create_session(trainer_template_fingerprint=engine_fingerprint(engine))
    assert ok["template_status"] == "verified"


def test_engine_without_tokenize_is_unverified_never_a_silent_pass(tmp_path) -> None:
    import orjson

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/version":
            return httpx.Response(200, json={"version": "x"})
        return httpx.Response(404, json={"error": {"message": "no such route"}})

    from openenv_harness.recorder.upstream import HTTPEngine

    config = RecorderConfig(store_path=str(tmp_path / "r.db"), admin_token=ADMIN)
    with RecorderServer(config, upstreams={"default": HTTPEngine("http://engine", transport=httpx.MockTransport(handler))}) as server, \
            RecorderClient(server.url, ADMIN) as admin:
        s = admin.create_session(trainer_template_fingerprint="tpl1-" + "1" * 64)
        assert s["template_status"] == "unverified" and s["warnings"]
        assert orjson.loads(orjson.dumps(admin.session(s["session_id"])))["template_status"] == "unverified"


def test_metrics_exposition(engine: EngineServer, recorder: RecorderServer, admin: RecorderClient) -> None:
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(0))
    httpx.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
               json={"model": "reference-model", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS})
    text = admin.metrics_text()
    for name in ("oeh_calls_total", "oeh_call_seconds_bucket", "oeh_upstream_seconds_bucket", "oeh_records_stored_total",
                 "oeh_budget_stops_total", "oeh_chain_transitions_total", "oeh_errors_total", "oeh_sessions"):
        assert name in text or name.replace("_total", "") in text, name
    assert 'oeh_calls_total{call_kind="agent",status="ok"} 1.0' in text


def test_sampling_the_engine_filled_in_is_unknown_unless_someone_says(tmp_path) -> None:
    """An engine with no render route and no configured defaults: the fields the agent left out are
    listed as unknown, never guessed; configured defaults make them known."""
    import httpx
    import orjson

    from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
    from openenv_harness.recorder.upstream import HTTPEngine

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/chat/completions":
            return httpx.Response(404, json={"error": {"message": "Not Found"}})
        return httpx.Response(200, content=orjson.dumps({
            "id": "c", "object": "chat.completion", "created": 1, "model": "m", "prompt_token_ids": [1, 2],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop",
                         "token_ids": [3], "logprobs": {"content": [{"token": "x", "logprob": -0.5}]}}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}}),
            headers={"content-type": "application/json"})

    admin_token = "admin-" + "p" * 32
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    out = {}
    for name, configured in (("unknown", None), ("configured", {"temperature": 0.6, "top_p": 0.9})):
        config = RecorderConfig(store_path=str(tmp_path / f"{name}.db"), admin_token=admin_token, probe_template=False, probe_logprobs_mode=False,
                                engine_sampling_defaults=configured)
        engine = HTTPEngine("http://engine", transport=httpx.MockTransport(handler))
        with RecorderServer(config, upstreams={"default": engine}) as server, \
                RecorderClient(server.url, admin_token) as admin:
            s = admin.create_session()
            r = httpx.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                           json={"model": "m", "messages": [{"role": "user", "content": "q"}], "tools": tools,
                                 "top_k": 5})
            assert r.status_code == 200, r.text
            out[name] = admin.records(s["session_id"])[0]["metadata"]["provenance"]
    unknown, known = out["unknown"], out["configured"]
    assert unknown["engine_sampling_defaults"] == "unknown" and unknown["engine_sampling_defaults_source"] == "unknown"
    assert unknown["sampling_effective"] == {"top_k": 5}
    assert "temperature" in unknown["sampling_unknown"] and "top_k" not in unknown["sampling_unknown"]
    assert known["engine_sampling_defaults_source"] == "configured"
    assert known["sampling_effective"] == {"top_k": 5, "temperature": 0.6, "top_p": 0.9}
    assert "temperature" not in known["sampling_unknown"]


def test_a_strict_tool_is_a_decoding_constraint_whatever_tool_choice_says() -> None:
    from openenv_harness.recorder.engine_knowledge.provenance import decoding_constraint

    loose = {"type": "function", "function": {"name": "bash", "parameters": {}}}
    strict = {"type": "function", "function": {"name": "edit", "parameters": {}, "strict": True}}
    assert decoding_constraint({"tools": [loose], "tool_choice": "auto"}) is None
    assert decoding_constraint({"tools": [loose, strict]}) == {"strict_tools": ["edit"]}
    # the Responses API's flat tool shape
    assert decoding_constraint({"tools": [{"type": "function", "name": "apply", "strict": True}]}) == {
        "strict_tools": ["apply"]}
    assert decoding_constraint({"tools": [{"type": "function", "function": {"name": "x", "strict": False}}]}) is None
