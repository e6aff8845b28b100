"""Budgets (D13): checked before each call, the cap recorded as the stop condition, 400 to the agent."""

from __future__ import annotations

import time

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderServer
from openenv_harness.testing.engine import EngineServer, Script, ToolCallSpec, Turn

from agentloop import TOOLS

LOOP = Script(turns=[Turn(tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls"})])], repeat_last=True)


def drive(s: dict, n: int) -> list[httpx.Response]:
    messages = [{"role": "user", "content": "loop"}]
    out = []
    with httpx.Client(timeout=30) as c:
        for _ in range(n):
            r = c.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"},
                       json={"model": "reference-model", "messages": messages, "tools": TOOLS})
            out.append(r)
            if r.status_code != 200:
                break
            msg = r.json()["choices"][0]["message"]
            messages = messages + [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "x"}]
    return out


@pytest.mark.parametrize("budgets, cap, served", [
    ({"max_agent_calls": 3}, "max_agent_calls", 3),
    ({"max_calls": 2}, "max_calls", 2),
    ({"max_completion_tokens": 1}, "max_completion_tokens", 1),
    ({"max_prompt_tokens": 1}, "max_prompt_tokens", 1),
    ({"max_total_tokens": 1}, "max_total_tokens", 1),
])
def test_caps_stop_the_session(budgets: dict, cap: str, served: int, engine: EngineServer, recorder: RecorderServer,
                               admin: RecorderClient) -> None:
    s = admin.create_session(budgets=budgets)
    engine.set_script(s["session_id"], LOOP)
    replies = drive(s, 10)
    assert [r.status_code for r in replies] == [200] * served + [400]
    err = replies[-1].json()["error"]
    assert err["code"] == "budget_exhausted" and cap in err["message"]
    info = admin.session(s["session_id"])
    assert info["status"] == "stopped" and info["stop_reason"] == cap
    records = admin.records(s["session_id"])
    assert len(records) == served  # the refused call is not a record: nothing synthetic is recorded
    assert all(r["metadata"]["status"] == "ok" for r in records)
    assert records[-1]["metadata"]["limits"][cap] == budgets[cap]
    # later calls keep being refused the same way (no retry storm: 400 is not retryable)
    again = drive(s, 1)
    assert again[0].status_code == 400 and len(admin.records(s["session_id"])) == served
    # waiters see the stop
    assert admin.wait(s["session_id"], until="stopped", timeout_s=1)["timed_out"] is False


def test_wall_clock(engine: EngineServer, recorder: RecorderServer, admin: RecorderClient) -> None:
    s = admin.create_session(budgets={"max_wall_clock_s": 0.4})
    engine.set_script(s["session_id"], LOOP)
    assert drive(s, 1)[0].status_code == 200
    time.sleep(0.5)
    r = drive(s, 1)[0]
    assert r.status_code == 400 and "max_wall_clock_s" in r.json()["error"]["message"]
    assert admin.session(s["session_id"])["stop_reason"] == "max_wall_clock_s"


def test_what_a_budget_counts(engine: EngineServer, recorder: RecorderServer, admin: RecorderClient) -> None:
    """``max_calls`` counts records: every call the engine was asked, served or not (an agent looping on
    calls the engine rejects still ends). ``max_agent_calls`` and the token caps count served calls.
    Calls refused before the engine (bad input, auth) and replayed retries count against nothing."""
    s = admin.create_session(budgets={"max_calls": 4, "max_agent_calls": 2})
    engine.set_script(s["session_id"], LOOP)
    url, auth = f"{s['base_url']}/chat/completions", {"authorization": f"Bearer {s['secret']}"}
    agent = {"model": "reference-model", "messages": [{"role": "user", "content": "loop"}], "tools": TOOLS}
    again = {**agent, "messages": [{"role": "user", "content": "again"}]}
    with httpx.Client(timeout=30) as c:
        assert c.post(url, content=b"{not json", headers=auth).status_code == 400  # refused: not counted
        assert c.post(url, json={**agent, "n": True}, headers=auth).status_code == 400  # refused: not counted
        rejected = c.post(url, json={**agent, "max_tokens": -5}, headers=auth)  # the engine says 400
        assert rejected.status_code == 400 and rejected.json()["error"]["message"].startswith("engine:")
        assert c.post(url, json=agent, headers=auth).status_code == 200
        assert c.post(url, json=agent, headers=auth).status_code == 200  # a byte-identical retry: replayed
        assert c.post(url, json=again, headers=auth).status_code == 200
        records = admin.records(s["session_id"])
        assert [r["metadata"]["status"] for r in records] == ["failed", "ok", "ok"]
        assert [(r["metadata"]["limits"]["calls"], r["metadata"]["limits"]["agent_calls"]) for r in records] == [
            (1, 0), (2, 1), (3, 2)]
        refused = c.post(url, json={**agent, "messages": [{"role": "user", "content": "more"}]}, headers=auth)
        assert refused.status_code == 400 and "max_agent_calls" in refused.json()["error"]["message"]

        looping = admin.create_session(budgets={"max_calls": 2})
        auth = {"authorization": f"Bearer {looping['secret']}"}
        url = f"{looping['base_url']}/chat/completions"
        for tokens in (-5, -6):  # the engine rejects both: each is a record, each counts
            assert c.post(url, json={**agent, "max_tokens": tokens}, headers=auth).status_code == 400
        stopped = c.post(url, json=agent, headers=auth)
        assert stopped.status_code == 400 and "max_calls" in stopped.json()["error"]["message"]
    assert len(admin.records(s["session_id"])) == 3 and len(admin.records(looping["session_id"])) == 2
