"""Whole calls through the recorder to the reference engine, over loopback HTTP."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from openenv.core.harness import TrainingTrace

from openenv_harness.recorder import RecorderClient, RecorderServer
from openenv_harness.testing.engine import EngineServer

from agentloop import tool_script, run_agent


@pytest.mark.parametrize("stream", [False, True])
def test_ten_turn_tool_session_is_recorded_exactly(stream: bool, engine: EngineServer, recorder: RecorderServer,
                                                   admin: RecorderClient) -> None:
    s = admin.create_session(metadata={"task": "t1"})
    engine.set_script(s["session_id"], tool_script(9))
    replies = run_agent(s["base_url"], s["secret"], stream=stream)
    assert len(replies) == 10 and not replies[-1].get("tool_calls")
    records = admin.records(s["session_id"])
    assert len(records) == 10
    forwarded = engine.requests(s["session_id"])
    assert len(forwarded) == 10
    for i, (rec, fwd) in enumerate(zip(records, forwarded)):
        md = rec["metadata"]
        assert md["call_index"] == i and md["node_id"] == f"{s['session_id']}/{i}" and md["status"] == "ok"
        assert md["call_kind"] == "agent" and md["stream"] is stream
        # what the engine received: the agent's body plus only the capture fields
        sent = fwd["body"]
        assert sent["return_token_ids"] is True and sent["logprobs"] is True and sent["stream"] is False
        assert sent["top_logprobs"] == 0 and "stream_options" not in sent
        assert sent["messages"] == rec["request"]["messages"]
        assert rec["loss_mask"] == [0] * len(rec["prompt_token_ids"]) + [1] * len(rec["completion_token_ids"])
        assert len(rec["per_token_logps"]) == len(rec["completion_token_ids"])
        assert "prompt_token_ids" not in rec["response"] and "token_ids" not in rec["response"]["choices"][0]
    # canonical sampling + compact args + OpenCode-style echo: every transition is exact
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root"] + ["exact"] * 9
    trace = TrainingTrace.model_validate(admin.training_trace_json(s["session_id"]))
    assert len(trace.turns) == 10


def test_recorded_ids_are_what_the_engine_sampled_even_non_canonical(engine: EngineServer, recorder: RecorderServer,
                                                                      admin: RecorderClient) -> None:
    from openenv_harness.testing.engine import is_noncanonical, reference_tokenizer

    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(3, segmentation="noncanonical"))
    run_agent(s["base_url"], s["secret"], stream=True)
    records = admin.records(s["session_id"])
    sampled = [e["sampled"] for e in engine.requests(s["session_id"])]
    assert len(sampled) == len(records) == 4
    tok = reference_tokenizer()
    for rec, got in zip(records, sampled):
        assert rec["completion_token_ids"] == got["token_ids"]
        assert rec["prompt_token_ids"] == got["prompt_token_ids"]
        assert rec["per_token_logps"] == got["logprobs"]
    assert any(is_noncanonical(tok, r["completion_token_ids"]) for r in records)
    # the engine re-encodes the echoed text canonically: the recorder sees replay drift, never "exact"
    classes = [r["metadata"]["fidelity"]["class"] for r in records[1:]]
    assert "replay_drift" in classes and "break" not in classes


def test_rewritten_tool_arguments_are_replay_drift(engine: EngineServer, recorder: RecorderServer,
                                                   admin: RecorderClient) -> None:
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(2, spaced_args=True))
    run_agent(s["base_url"], s["secret"], stream=True, echo="pi")
    records = admin.records(s["session_id"])
    fid = [r["metadata"]["fidelity"] for r in records]
    assert [f["class"] for f in fid] == ["root", "replay_drift", "replay_drift"]
    assert all(f["divergence_at"] >= len(records[i]["prompt_token_ids"]) for i, f in enumerate(fid[1:]))


def test_parallel_sessions_never_cross(engine: EngineServer, recorder: RecorderServer, admin: RecorderClient) -> None:
    sessions = [admin.create_session(metadata={"i": i}) for i in range(12)]
    for i, s in enumerate(sessions):
        engine.set_script(s["session_id"], tool_script(2 + i % 4))

    def run(s: dict) -> int:
        return len(run_agent(s["base_url"], s["secret"], stream=bool(hash(s["session_id"]) % 2)))

    with ThreadPoolExecutor(max_workers=12) as pool:
        counts = list(pool.map(run, sessions))
    for i, (s, n) in enumerate(zip(sessions, counts)):
        records = admin.records(s["session_id"])
        assert n == 3 + i % 4 == len(records)
        assert {r["metadata"]["session_id"] for r in records} == {s["session_id"]}
        fwd = engine.requests(s["session_id"])
        assert [r["prompt_token_ids"] for r in records] == [f["sampled"]["prompt_token_ids"] for f in fwd]
    seqs = [r["metadata"]["seq"] for s in sessions for r in admin.records(s["session_id"])]
    assert len(set(seqs)) == len(seqs)


def test_session_header_is_forwarded_and_closed_sessions_refuse(engine: EngineServer, recorder: RecorderServer,
                                                                admin: RecorderClient) -> None:
    s = admin.create_session()
    engine.set_script(s["session_id"], tool_script(0))
    run_agent(s["base_url"], s["secret"], stream=False)
    assert engine.requests(s["session_id"])[0]["headers"]["x-openenv-harness-session"] == s["session_id"]
    admin.close_session(s["session_id"])
    import httpx

    r = httpx.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                   json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 409 and r.json()["error"]["code"] == "session_closed"
    assert len(admin.records(s["session_id"])) == 1
