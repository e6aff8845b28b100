"""Budgets (D13): checked before each call, the cap recorded as the stop condition, 400 to the agent."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.upstream.base import Upstream, UpstreamReply
from openenv_harness.testing.engine import EngineServer, Script, ToolCallSpec, Turn, reference_tokenizer

from agentloop import ADMIN, TOOLS

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


# -- tool-call caps: applied to each reply before the agent sees it -------------------------------

def _call(name: str, command: str) -> ToolCallSpec:
    return ToolCallSpec(name=name, arguments={"command": command})


TWO_CALLS = Turn(tool_calls=[_call("bash", "echo one"), _call("bash", "echo two")])


def tool_loop(base_url: str, secret: str, n: int) -> list[httpx.Response]:
    """An agent that runs every tool call it receives and calls again, until a reply has none."""
    messages: list[dict] = [{"role": "user", "content": "loop"}]
    out = []
    with httpx.Client(timeout=30) as c:
        for _ in range(n):
            r = c.post(f"{base_url}/chat/completions", headers={"authorization": f"Bearer {secret}"},
                       json={"model": "reference-model", "messages": messages, "tools": TOOLS})
            out.append(r)
            if r.status_code != 200:
                break
            msg = r.json()["choices"][0]["message"]
            if not msg.get("tool_calls"):
                break
            messages = messages + [msg] + [{"role": "tool", "tool_call_id": call["id"], "content": "ok"}
                                           for call in msg["tool_calls"]]
    return out


def test_max_tool_calls_per_turn_cuts_the_reply_and_the_session_goes_on(
        engine: EngineServer, recorder: RecorderServer, admin: RecorderClient) -> None:
    s = admin.create_session(budgets={"max_tool_calls_per_turn": 1})
    engine.set_script(s["session_id"], Script(turns=[TWO_CALLS, TWO_CALLS], final_text="Done."))
    replies = tool_loop(s["base_url"], s["secret"], 10)
    assert [r.status_code for r in replies] == [200, 200, 200]
    first = replies[0].json()["choices"][0]
    assert [json.loads(c["function"]["arguments"])["command"] for c in first["message"]["tool_calls"]] == ["echo one"]
    assert first["finish_reason"] == "tool_calls"
    info = admin.session(s["session_id"])
    assert info["status"] == "open" and info["stop_reason"] is None and info["tool_calls"] == 2
    records = admin.records(s["session_id"])
    cut = records[0]["metadata"]["tool_limit"]
    assert cut["cap"] == "max_tool_calls_per_turn" and (cut["sampled"], cut["delivered"]) == (2, 1)
    assert json.loads(cut["dropped"][0]["function"]["arguments"]) == {"command": "echo two"}
    # the record keeps the policy's sample (both calls are in its ids); its response is what the agent got
    assert records[0]["response"]["choices"][0]["message"]["tool_calls"] == first["message"]["tool_calls"]
    assert "echo two" in reference_tokenizer().decode(records[0]["completion_token_ids"])
    assert records[0]["metadata"]["limits"]["max_tool_calls_per_turn"] == 1
    assert "tool_limit" not in records[2]["metadata"]  # the final answer had no tool calls to cut


def test_max_total_tool_calls_cuts_the_reply_that_passes_it_and_stops_the_session(
        engine: EngineServer, recorder: RecorderServer, admin: RecorderClient) -> None:
    s = admin.create_session(budgets={"max_total_tool_calls": 3})
    engine.set_script(s["session_id"], Script(turns=[TWO_CALLS], repeat_last=True))
    replies = tool_loop(s["base_url"], s["secret"], 10)
    assert [r.status_code for r in replies] == [200, 200, 400]
    assert [len(r.json()["choices"][0]["message"]["tool_calls"]) for r in replies[:2]] == [2, 1]
    err = replies[-1].json()["error"]
    assert err["code"] == "budget_exhausted" and "max_total_tool_calls" in err["message"]
    info = admin.session(s["session_id"])
    assert info["status"] == "stopped" and info["stop_reason"] == "max_total_tool_calls" and info["tool_calls"] == 3
    records = admin.records(s["session_id"])
    assert len(records) == 2 and "tool_limit" not in records[0]["metadata"]
    cut = records[1]["metadata"]["tool_limit"]
    assert cut["cap"] == "max_total_tool_calls" and (cut["sampled"], cut["delivered"]) == (2, 1)
    assert records[1]["metadata"]["limits"]["stop"] == "max_total_tool_calls"
    assert records[1]["metadata"]["limits"]["tool_calls"] == 3


def test_a_reply_with_no_room_left_reaches_the_agent_without_tool_calls(
        engine: EngineServer, recorder: RecorderServer, admin: RecorderClient) -> None:
    s = admin.create_session(budgets={"max_total_tool_calls": 1})
    engine.set_script(s["session_id"], LOOP)
    replies = tool_loop(s["base_url"], s["secret"], 10)
    assert [r.status_code for r in replies] == [200, 200]
    last = replies[1].json()["choices"][0]
    assert "tool_calls" not in last["message"] and last["finish_reason"] == "stop"
    info = admin.session(s["session_id"])
    assert info["stop_reason"] == "max_total_tool_calls" and info["tool_calls"] == 1
    cut = admin.records(s["session_id"])[1]["metadata"]["tool_limit"]
    assert (cut["sampled"], cut["delivered"], len(cut["dropped"])) == (1, 0, 1)
    assert tool_loop(s["base_url"], s["secret"], 1)[0].status_code == 400


def test_a_retried_cut_call_is_replayed_as_cut(engine: EngineServer, recorder: RecorderServer,
                                              admin: RecorderClient) -> None:
    s = admin.create_session(budgets={"max_tool_calls_per_turn": 1})
    engine.set_script(s["session_id"], Script(turns=[TWO_CALLS]))
    body = {"model": "reference-model", "messages": [{"role": "user", "content": "go"}], "tools": TOOLS}
    auth = {"authorization": f"Bearer {s['secret']}"}
    first = httpx.post(f"{s['base_url']}/chat/completions", headers=auth, json=body, timeout=30)
    again = httpx.post(f"{s['base_url']}/chat/completions", headers=auth, json=body, timeout=30)
    assert first.status_code == again.status_code == 200
    assert again.json()["choices"] == first.json()["choices"]
    assert len(first.json()["choices"][0]["message"]["tool_calls"]) == 1
    assert len(admin.records(s["session_id"])) == 1 and admin.session(s["session_id"])["tool_calls"] == 1


def test_tool_calls_keep_counting_across_a_restart(tmp_path: Path, engine: EngineServer) -> None:
    config = RecorderConfig(store_path=str(tmp_path / "restart.db"), engine_url=engine.url, admin_token=ADMIN)
    with RecorderServer(config) as first, RecorderClient(first.url, ADMIN) as admin:
        s = admin.create_session(budgets={"max_total_tool_calls": 3})
        engine.set_script(s["session_id"], Script(turns=[TWO_CALLS]))
        assert tool_loop(s["base_url"], s["secret"], 1)[0].status_code == 200
    with RecorderServer(config) as second, RecorderClient(second.url, ADMIN) as admin:
        assert admin.session(s["session_id"])["tool_calls"] == 2
        engine.set_script(s["session_id"], Script(turns=[TWO_CALLS], repeat_last=True))
        body = {"model": "reference-model", "tools": TOOLS, "messages": [
            {"role": "user", "content": "loop"}, {"role": "assistant", "content": "ran both"}]}
        r = httpx.post(f"{second.url}/rollout/{s['session_id']}/v1/chat/completions", json=body, timeout=30,
                       headers={"authorization": f"Bearer {s['secret']}"})
        assert r.status_code == 200 and len(r.json()["choices"][0]["message"]["tool_calls"]) == 1
        assert admin.session(s["session_id"])["stop_reason"] == "max_total_tool_calls"


class AbortingOnce(Upstream):
    """A test-double engine: its first reply is aborted part-way (``finish_reason=abort``), the
    next ones complete; each asks for the same two tool calls."""

    name = "aborting-once"

    def __init__(self) -> None:
        self.calls = 0

    async def chat(self, body: dict, *, session_id: str, affinity: str | None = None) -> UpstreamReply:
        self.calls += 1
        calls = [{"id": f"c{self.calls}_{i}", "type": "function",
                  "function": {"name": "bash", "arguments": json.dumps({"command": f"echo {i}"})}} for i in range(2)]
        reply = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "prompt_token_ids": [1, 2, 3],
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "", "tool_calls": calls},
                              "finish_reason": "abort" if self.calls == 1 else "tool_calls", "token_ids": [4, 5],
                              "logprobs": {"content": [{"token": "token_id:4", "logprob": -0.1},
                                                       {"token": "token_id:5", "logprob": -0.2}]}}],
                 "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
        return UpstreamReply(status=200, json=reply)


def test_an_aborted_reply_is_not_counted_against_the_tool_calls(recorder: RecorderServer,
                                                               admin: RecorderClient) -> None:
    recorder.ctx.upstreams["aborting-once"] = AbortingOnce()
    s = admin.create_session(budgets={"max_total_tool_calls": 2}, upstream="aborting-once")
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}], "tools": TOOLS}
    auth = {"authorization": f"Bearer {s['secret']}"}
    aborted = httpx.post(f"{s['base_url']}/chat/completions", headers=auth, json=body, timeout=30)
    assert aborted.status_code == 503  # the agent never received the aborted reply: it retries
    retried = httpx.post(f"{s['base_url']}/chat/completions", headers=auth, json=body, timeout=30)
    assert retried.status_code == 200 and len(retried.json()["choices"][0]["message"]["tool_calls"]) == 2
    info = admin.session(s["session_id"])
    assert info["tool_calls"] == 2 and info["status"] == "open"
    assert [r["metadata"].get("tool_limit") for r in admin.records(s["session_id"])] == [None, None]
    # what a restart rebuilds from the records is what the live ledger counted: the aborted call
    # is a call and an invalid one, not an agent call and no tokens
    live = recorder.ctx.sessions.get(s["session_id"]).ledger.counters
    [restored] = [row for row in recorder.ctx.store.load_sessions() if row.session_id == s["session_id"]]
    assert restored.state["totals"] == {"calls": 2, "agent_calls": 1, "prompt_tokens": 3, "completion_tokens": 2,
                                        "failed_calls": 0, "invalid_calls": 1, "tool_calls": 2}
    assert {k: getattr(live, k) for k in restored.state["totals"]} == restored.state["totals"]

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
