"""Every way the incremental mode can be uncertain falls back to full history with the reason
recorded (or, strict, rejects); an engine error mid-way reaches the agent and is recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineConfig, EngineServer, Fault

from agentloop import ADMIN, TOOLS, run_agent, tool_script


def _reasons(records: list[dict]) -> list[str | None]:
    return [r["metadata"]["prompt_mode"]["reason"] for r in records]


def _classes(records: list[dict]) -> list[str]:
    return [r["metadata"]["fidelity"]["class"] for r in records]


def _post(s: dict, messages: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                      json={"model": "reference-model", "messages": messages, "tools": TOOLS, "max_tokens": 256},
                      timeout=60)


def test_an_engine_without_the_routes_falls_back_and_strict_rejects(tmp_path: Path) -> None:
    with EngineServer(EngineConfig(scale_out=False)) as engine, RecorderServer(RecorderConfig(
            store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN)) as rec, \
            RecorderClient(rec.url, ADMIN) as admin:
        s = admin.create_session(prompt_mode="incremental")
        engine.set_script(s["session_id"], tool_script(2, spaced_args=True))
        run_agent(s["base_url"], s["secret"], stream=False, echo="pi")
        records = admin.records(s["session_id"])
        assert _reasons(records) == ["chain_start", "no_scale_out_routes", "no_scale_out_routes"]
        assert "--enable-scale-out" in records[1]["metadata"]["prompt_mode"]["detail"]
        assert _classes(records) == ["root", "replay_drift", "replay_drift"]  # full history: drift shows
        strict = admin.create_session(prompt_mode="incremental", prompt_mode_strict=True)
        engine.set_script(strict["session_id"], tool_script(2, spaced_args=True))
        first = _post(strict, [{"role": "user", "content": "go"}]).json()["choices"][0]["message"]
        call = first["tool_calls"][0]
        replay = {"role": "assistant", "content": first["content"], "tool_calls": [call]}
        r = _post(strict, [{"role": "user", "content": "go"}, replay,
                           {"role": "tool", "tool_call_id": call["id"], "content": "ok"}])
        assert r.status_code == 409 and r.json()["error"]["code"] == "prompt_mode_uncertain"
        assert len(admin.records(strict["session_id"])) == 1


def test_an_uncertified_junction_falls_back(tmp_path: Path, engine: EngineServer) -> None:
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN,
                            probe_template=False, probe_logprobs_mode=False)
    with RecorderServer(config) as rec, RecorderClient(rec.url, ADMIN) as admin:
        s = admin.create_session(prompt_mode="incremental")
        engine.set_script(s["session_id"], tool_script(1, spaced_args=True))
        run_agent(s["base_url"], s["secret"], stream=True, echo="pi")
        records = admin.records(s["session_id"])
        assert _reasons(records) == ["chain_start", "junction_uncertified"]
        assert [e["path"] for e in engine.requests(s["session_id"])] == ["/v1/chat/completions"] * 2


def test_an_edited_history_starts_a_new_chain(engine: EngineServer, recorder: RecorderServer,
                                              admin: RecorderClient) -> None:
    s = admin.create_session(prompt_mode="incremental", prompt_mode_strict=True)
    engine.set_script(s["session_id"], tool_script(2))
    user = {"role": "user", "content": "go"}
    first = _post(s, [user]).json()["choices"][0]["message"]
    call = first["tool_calls"][0]
    tail = [{"role": "assistant", "content": first["content"], "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "ok"}]
    assert _post(s, [{"role": "user", "content": "go, carefully"}, *tail]).status_code == 200  # edited
    assert _post(s, [user, *tail]).status_code == 200  # the original chain continues (like a sub-agent)
    records = admin.records(s["session_id"])
    assert _reasons(records) == ["chain_start", "history_changed", None]
    assert _classes(records) == ["root", "break", "exact"]


def test_a_render_failure_falls_back(engine: EngineServer, recorder: RecorderServer, admin: RecorderClient) -> None:
    s = admin.create_session(prompt_mode="incremental")
    engine.set_script(s["session_id"], tool_script(2))
    engine.add_fault(s["session_id"], Fault(status=500, route="/v1/chat/completions/render", on_turn=1))
    run_agent(s["base_url"], s["secret"], stream=False, echo="pi")
    records = admin.records(s["session_id"])
    assert _reasons(records) == ["chain_start", "render_failed", None]
    assert "HTTP 500" in records[1]["metadata"]["prompt_mode"]["detail"]
    assert _classes(records) == ["root", "exact", "exact"]  # compact arguments: full history was exact too


def test_an_engine_error_mid_way_reaches_the_agent_and_is_recorded(engine: EngineServer, recorder: RecorderServer,
                                                                   admin: RecorderClient) -> None:
    s = admin.create_session(prompt_mode="incremental")
    engine.set_script(s["session_id"], tool_script(2))
    engine.add_fault(s["session_id"], Fault(status=500, on_turn=1))
    user = {"role": "user", "content": "go"}
    first = _post(s, [user]).json()["choices"][0]["message"]
    call = first["tool_calls"][0]
    messages = [user, {"role": "assistant", "content": first["content"], "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": "ok"}]
    r = _post(s, messages)
    assert r.status_code == 500 and r.json()["error"]["message"]
    assert [e["path"] for e in engine.requests(s["session_id"])][-1] == "/inference/v1/generate"
    records = admin.records(s["session_id"])
    assert [r["metadata"]["status"] for r in records] == ["ok", "failed"]
    assert records[1]["metadata"]["error"]["upstream_status"] == 500
    assert records[1]["metadata"]["prompt_mode"]["failed_at"] == "/inference/v1/generate"
    assert _post(s, messages).status_code == 200  # the retry continues the chain exactly
    records = admin.records(s["session_id"])
    assert records[-1]["metadata"]["prompt_mode"]["continued"] is True
    assert _classes([records[0], records[-1]]) == ["root", "exact"]


def test_a_white_box_model_step_falls_back(tmp_path: Path) -> None:
    """A ModelStep takes messages, not prompt ids: incremental calls are served in full history."""
    from openenv_harness.recorder.upstream.model_step import ModelStepUpstream
    from openenv_harness.testing.model_step import ScriptedModelStep

    step = ScriptedModelStep(["ls", "cat a.py"], "done")
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url="http://127.0.0.1:9", admin_token=ADMIN)
    with RecorderServer(config, upstreams={"step": ModelStepUpstream(step)}) as rec, \
            RecorderClient(rec.url, ADMIN) as admin:
        s = admin.create_session(prompt_mode="incremental", upstream="step")
        run_agent(s["base_url"], s["secret"], stream=False, echo="pi")
        records = admin.records(s["session_id"])
        assert _reasons(records) == ["chain_start", "no_scale_out_routes", "no_scale_out_routes"]
        assert "ModelStep" in records[1]["metadata"]["prompt_mode"]["detail"]
        assert len(step.calls) == 3
