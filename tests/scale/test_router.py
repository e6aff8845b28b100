"""Sticky sessions over engine replicas through the real vllm-router (``consistent_hash``).

Three reference engines behind the router binary from PyPI; a recorder whose engine URL is the
router. Each replica's request log says which replica served which call of which session.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any


from openenv_harness.engine.router import VLLMRouter
from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineServer
from openenv_harness.testing.recorder_fixtures import admin_fixture, recorder_fixture

from agentloop import ADMIN, run_agent, tool_script

#: vllm-router 0.1.17's line for each request it routes by a key (log level info)
ROUTED = re.compile(r"Consistent hash routing: key='header:x-session-id:(?P<key>[^']+)' -> worker='(?P<worker>[^']+)'")


#: the recorder in front of the router, not of one engine
recorder = recorder_fixture(ADMIN, engine="router")
admin = admin_fixture(ADMIN)


def _served_by(replicas: list[EngineServer]) -> dict[str, list[tuple[int, dict[str, Any]]]]:
    """Session id -> (replica index, logged request) for every engine call the replicas saw."""
    seen: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for index, engine in enumerate(replicas):
        for entry in engine.requests():
            if entry.get("session"):
                seen[entry["session"]].append((index, entry))
    return seen


def _routed(router: VLLMRouter) -> dict[str, list[str]]:
    """Affinity key -> the worker the router sent each of its requests to (the router's own log)."""
    assert router.log_path is not None
    out: dict[str, list[str]] = defaultdict(list)
    for match in ROUTED.finditer(router.log_path.read_text(errors="replace")):
        out[match["key"]].append(match["worker"])
    return out


def _start(admin: RecorderClient, replicas: list[EngineServer], turns: int, **spec: Any) -> dict[str, Any]:
    session = admin.create_session(**spec)
    for engine in replicas:  # the router picks the replica: every one knows the script
        engine.set_script(session["session_id"], tool_script(turns))
    return session


def test_the_router_lists_its_replicas(router: VLLMRouter, replicas: list[EngineServer]) -> None:
    assert sorted(router.workers()) == sorted(e.url for e in replicas)


def test_every_call_of_a_session_reaches_one_replica_and_sessions_spread(
        admin: RecorderClient, replicas: list[EngineServer]) -> None:
    sessions = [_start(admin, replicas, 2) for _ in range(12)]
    for n, s in enumerate(sessions):
        run_agent(s["base_url"], s["secret"], stream=bool(n % 2), echo="pi")
    served = _served_by(replicas)
    keys = {s["affinity_key"] for s in sessions}
    assert len(keys) == len(sessions), "every trajectory has a key of its own"
    used: set[int] = set()
    for s in sessions:
        calls = served[s["session_id"]]
        assert len(calls) == 3
        where = {index for index, _ in calls}
        assert len(where) == 1, f"session {s['session_id']} was split over replicas {where}"
        used |= where
        assert {entry["headers"].get("x-session-id") for _, entry in calls} == {s["affinity_key"]}
    # 12 random keys on 3 replicas all hashing to one: probability 3**-11
    assert len(used) >= 2, "the router's consistent hash spread the sessions"


def test_every_token_field_survives_the_router(admin: RecorderClient, replicas: list[EngineServer]) -> None:
    """What the replica sampled is what the recorder stored: prompt ids, sampled ids, logprobs,
    streamed and not."""
    for stream in (False, True):
        s = _start(admin, replicas, 2)
        run_agent(s["base_url"], s["secret"], stream=stream, echo="pi")
        records = admin.records(s["session_id"])
        sampled = [entry["sampled"] for _, entry in _served_by(replicas)[s["session_id"]]]
        assert len(records) == len(sampled) == 3
        assert [r["prompt_token_ids"] for r in records] == [x["prompt_token_ids"] for x in sampled]
        assert [r["completion_token_ids"] for r in records] == [x["token_ids"] for x in sampled]
        assert [r["per_token_logps"] for r in records] == [x["logprobs"] for x in sampled]
        assert all(r["metadata"]["status"] == "ok" and r["metadata"]["trainable"] for r in records)
        assert {r["metadata"]["provenance"]["affinity_key"] for r in records} == {s["affinity_key"]}
        assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact", "exact"]


def test_incremental_prompts_use_the_scale_out_routes_through_the_router(
        admin: RecorderClient, replicas: list[EngineServer], router: VLLMRouter) -> None:
    """Render, generate and derender (the incremental prompt mode's routes) pass the router with their
    token fields, and every one of a session's requests goes to its replica (the router's log)."""
    sessions = [_start(admin, replicas, 3, prompt_mode="incremental", prompt_mode_strict=True) for _ in range(3)]
    for s in sessions:
        run_agent(s["base_url"], s["secret"], stream=True, echo="pi")
    served = _served_by(replicas)
    for s in sessions:
        records = admin.records(s["session_id"])
        assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact", "exact", "exact"]
        assert all(r["metadata"]["prompt_mode"]["continued"] for r in records[1:])
        calls = served[s["session_id"]]
        assert [entry["path"] for _, entry in calls] == ["/v1/chat/completions"] + ["/inference/v1/generate"] * 3
        where = {replicas[index].url for index, _ in calls}
        routed = _routed(router)[s["affinity_key"]]
        # each continued call: its renders, the generate and the derender -- all to the session's replica
        assert len(routed) >= len(calls) + 3 * 3
        assert set(routed) == where and len(where) == 1
        # the generated ids the replica sampled are the record's
        generated = [entry["sampled"] for _, entry in calls if entry["path"] == "/inference/v1/generate"]
        assert [r["completion_token_ids"] for r in records[1:]] == [g["token_ids"] for g in generated]
        assert [r["prompt_token_ids"] for r in records[1:]] == [g["prompt_token_ids"] for g in generated]


def test_the_one_step_parse_through_the_router(tmp_path: Path) -> None:
    """Replicas with vLLM 0.33's one-step parse behind the router: whatever the router does to generate's
    ``output_mode`` and ``parse_context``, each continued call is exact and parsed by the engine once."""
    from openenv_harness.testing.engine import EngineConfig

    engines = [EngineServer(EngineConfig(generate_derender=True)).start() for _ in range(2)]
    try:
        with VLLMRouter([e.url for e in engines], log_path=tmp_path / "router.log") as router, \
                RecorderServer(RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=router.url,
                                              admin_token=ADMIN)) as rec, RecorderClient(rec.url, ADMIN) as admin:
            s = _start(admin, engines, 3, prompt_mode="incremental", prompt_mode_strict=True)
            run_agent(s["base_url"], s["secret"], stream=True, echo="pi")
            records = admin.records(s["session_id"])
        calls = [entry for _, entry in _served_by(engines)[s["session_id"]]]
    finally:
        for engine in engines:
            engine.stop()
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact", "exact", "exact"]
    generates = [c for c in calls if c["path"] == "/inference/v1/generate"]
    assert len(generates) == 3  # nothing sampled twice
    # vllm-router 0.1.17 passes the one-step fields through: generate parses, derender is never asked
    assert all(g["body"].get("output_mode") == "derender" and g["body"].get("parse_context") for g in generates)
    assert [r["metadata"]["prompt_mode"]["parsed_via"] for r in records[1:]] == ["/inference/v1/generate"] * 3
    assert not [c for c in calls if c["path"] == "/v1/chat/completions/derender"]
    assert [r["completion_token_ids"] for r in records[1:]] == [g["sampled"]["token_ids"] for g in generates]
