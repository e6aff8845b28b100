"""The engine's logprobs mode, measured; a session's training sampling policy, applied and checked.

Against the reference engine in both of vLLM's logprobs modes, over real loopback HTTP: the recorder
measures which mode the engine serves (not which one someone declared), records it on every call,
sends the policy's whole-vocabulary sampling whatever the agent asked (recording what it neutralised),
refuses a session whose temperature the engine's logprobs cannot serve, and marks a call whose effective
sampling is not the policy's untrainable.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from openenv_harness.recorder import RecorderAPIError, RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.sampling_policy import apply_policy, policy_differences, refusal
from openenv_harness.testing.engine import EngineConfig, EngineServer

from agentloop import ADMIN, TOOLS, tool_script


@pytest.fixture(scope="module", params=["raw_logprobs", "processed_logprobs"])
def mode_engine(request: pytest.FixtureRequest) -> Iterator[EngineServer]:
    with EngineServer(EngineConfig(logprobs_mode=request.param)) as engine:
        yield engine


def _recorder(tmp_path: Path, engine: EngineServer, **config: Any) -> RecorderServer:
    return RecorderServer(RecorderConfig(store_path=str(tmp_path / "records.db"), engine_url=engine.url,
                                         admin_token=ADMIN, **config))


def _call(session: dict[str, Any], **body: Any) -> httpx.Response:
    return httpx.post(f"{session['base_url']}/chat/completions", headers={"authorization": f"Bearer {session['secret']}"},
                      json={"model": "reference-model", "messages": [{"role": "user", "content": "x"}],
                            "tools": TOOLS, "max_tokens": 32, **body}, timeout=30)


def test_the_engines_logprobs_mode_is_measured_and_recorded(tmp_path: Path, mode_engine: EngineServer) -> None:
    mode = mode_engine.config.logprobs_mode
    # declared the other way round: the measurement wins, and says how it was made
    declared = "processed_logprobs" if mode == "raw_logprobs" else "raw_logprobs"
    with _recorder(tmp_path, mode_engine, engine_logprobs_mode=declared) as recorder, \
            RecorderClient(recorder.url, ADMIN) as admin:
        engine_info = admin.health()["engine"]
        assert engine_info["logprobs_mode"] == mode
        assert engine_info["logprobs_mode_measure"].startswith("measured: top-5 gap")
        s = admin.create_session()
        mode_engine.set_script(s["session_id"], tool_script(0))
        assert _call(s, temperature=0.5).status_code == 200
        prov = admin.records(s["session_id"])[0]["metadata"]["provenance"]
        assert (prov["logprobs_mode"], prov["logprobs_mode_source"]) == (mode, "measured")


def test_an_unmeasured_mode_falls_back_to_the_declared_one_then_unknown(tmp_path: Path, engine: EngineServer) -> None:
    for declared, expected in (("raw_logprobs", ("raw_logprobs", "configured")), (None, ("unknown", "unknown"))):
        with _recorder(tmp_path / str(declared), engine, probe_logprobs_mode=False,
                       engine_logprobs_mode=declared) as recorder, RecorderClient(recorder.url, ADMIN) as admin:
            assert "logprobs_mode" not in admin.health()["engine"]
            s = admin.create_session()
            engine.set_script(s["session_id"], tool_script(0))
            assert _call(s).status_code == 200
            prov = admin.records(s["session_id"])[0]["metadata"]["provenance"]
            assert (prov["logprobs_mode"], prov["logprobs_mode_source"]) == expected


def test_the_policy_neutralises_the_agents_narrowing_knobs(tmp_path: Path, engine: EngineServer) -> None:
    with _recorder(tmp_path, engine) as recorder, RecorderClient(recorder.url, ADMIN) as admin:
        s = admin.create_session(training_sampling={"temperature": 1.0})
        engine.set_script(s["session_id"], tool_script(0))
        agent = {"temperature": 0.3, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05, "logit_bias": {"15": 5}}
        assert _call(s, **agent).status_code == 200
        sent = engine.requests(s["session_id"])[-1]["body"]
        assert (sent["temperature"], sent["top_p"], sent["top_k"], sent["min_p"]) == (1.0, 1.0, -1, 0.0)
        assert sent["repetition_penalty"] == 1.0 and "logit_bias" not in sent
        record = admin.records(s["session_id"])[0]
        prov = record["metadata"]["provenance"]
        assert prov["sampling_from_agent"]["top_k"] == 20  # what the agent asked stays on record
        assert prov["sampling_neutralised"] == agent
        assert prov["sampling_policy"]["temperature"] == 1.0 and prov["sampling_policy_differs"] == {}
        assert record["metadata"]["trainable"] is True and "sampling_off_policy" not in record["metadata"]


def test_a_temperature_the_engines_logprobs_cannot_serve(tmp_path: Path, mode_engine: EngineServer) -> None:
    mode = mode_engine.config.logprobs_mode
    with _recorder(tmp_path, mode_engine) as recorder, RecorderClient(recorder.url, ADMIN) as admin:
        if mode == "raw_logprobs":
            with pytest.raises(RecorderAPIError) as refused:
                admin.create_session(training_sampling={"temperature": 0.7})
            assert refused.value.status == 409 and "processed_logprobs" in refused.value.message
            assert admin.create_session(training_sampling={"temperature": 1.0})["session_id"]
        else:
            s = admin.create_session(training_sampling={"temperature": 0.7})
            mode_engine.set_script(s["session_id"], tool_script(0))
            assert _call(s, temperature=1.3).status_code == 200
            md = admin.records(s["session_id"])[0]["metadata"]
            assert md["provenance"]["sampling_effective"]["temperature"] == 0.7
            assert md["trainable"] is True and md["provenance"]["sampling_policy_differs"] == {}
            sampled = mode_engine.requests(s["session_id"])[-1]["sampled"]["logprobs"]
            assert md["provenance"]["logprobs_mode"] == "processed_logprobs"
            assert sampled and all(lp <= 0 for lp in sampled)


def test_an_off_policy_call_is_recorded_and_not_trainable(tmp_path: Path, engine: EngineServer) -> None:
    # the engine's mode is not measured and nobody declared it: at temperature 0.7 the recorded logprobs may
    # be raw ones, so the call is kept, flagged with the difference, and never trained
    with _recorder(tmp_path, engine, probe_logprobs_mode=False) as recorder, RecorderClient(recorder.url, ADMIN) as admin:
        s = admin.create_session(training_sampling={"temperature": 0.7})
        assert s["warnings"] and "off the training policy" in s["warnings"][-1]
        engine.set_script(s["session_id"], tool_script(0))
        assert _call(s).status_code == 200
        md = admin.records(s["session_id"])[0]["metadata"]
        assert md["trainable"] is False
        assert md["sampling_off_policy"] == {"logprobs_mode": {"policy": "processed_logprobs", "effective": "unknown"}}
        training = admin.training_trace_json(s["session_id"])
        assert all(not any(turn["loss_mask"]) for turn in training["turns"])


def test_pins_that_contradict_the_policy_are_refused(admin: RecorderClient) -> None:
    with pytest.raises(RecorderAPIError) as refused:
        admin.create_session(training_sampling={"temperature": 1.0}, sampling={"top_p": 0.9})
    assert refused.value.status == 422
    assert admin.create_session(training_sampling={"temperature": 1.0}, sampling={"max_tokens": 64})["session_id"]


def test_policy_functions_on_their_own() -> None:
    out: dict[str, Any] = {"top_k": 0, "seed": 3}
    assert apply_policy(out, {"top_k": 0, "min_p": 0.1}, 1.0) == {"min_p": 0.1}  # top_k 0 is already off
    assert out["seed"] == 3 and out["top_k"] == -1
    assert policy_differences({"temperature": 1.0, "top_p": 0.95}, ["top_k"], "raw_logprobs", 1.0) == {
        "top_p": {"policy": 1.0, "effective": 0.95}, "top_k": {"policy": -1, "effective": "unknown"}}
    assert policy_differences({"temperature": 0.5}, [], "raw_logprobs", 0.5)["logprobs_mode"]["effective"] == "raw_logprobs"
    assert refusal(1.0, "raw_logprobs") is None and refusal(0.5, "processed_logprobs") is None
    assert "processed_logprobs" in (refusal(0.5, "raw_logprobs") or "")
