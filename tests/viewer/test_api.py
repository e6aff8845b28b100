"""The viewer's data routes over real HTTP, checked against the records the recorder stored."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from openenv_harness.assembly import compare_strategies
from openenv_harness.viewer.digest import DEFAULT_AROUND, DEFAULT_TAIL, MAX_SLICE

from viewer_support import ADMIN, ENGINE_ERROR, Recorded, login_cookie

AUTH = {"authorization": f"Bearer {ADMIN}"}


def api_routes(session_id: str) -> list[str]:
    base = f"/admin/viewer/api/sessions/{session_id}"
    return [f"{base}/calls", f"{base}/calls/1/tokens?part=prompt&start=0&stop=10", f"{base}/assembly"]


def get(http: httpx.Client, path: str, **params: Any) -> Any:
    reply = http.get(path, params=params, headers=AUTH)
    assert reply.status_code == 200, (path, reply.text)
    return reply.json()


def test_data_routes_need_the_admin_token(http: httpx.Client, recorded: Recorded) -> None:
    cookie = login_cookie(http)
    for path in api_routes(recorded.drift):
        refused = [{}, {"authorization": "Bearer wrong-token-0123456789"}, {"cookie": "oeh_admin=wrong-0123456789"},
                   {"authorization": f"Bearer {recorded.agent_secret}"},  # an agent key is not an admin token
                   {"cookie": f"oeh_admin={recorded.agent_secret}"}, {"x-api-key": recorded.agent_secret}]
        for headers in refused:
            reply = http.get(path, headers=headers)
            assert reply.status_code == 401, (path, headers, reply.text)
            assert reply.json()["error"]["type"] == "authentication_error"
        assert http.get(path, headers=AUTH).status_code == 200, path
        assert http.get(path, headers={"cookie": f"oeh_admin={cookie}"}).status_code == 200, path


def test_calls_digest_of_a_drifting_session(http: httpx.Client, recorded: Recorded) -> None:
    records = recorded.admin.records(recorded.drift)
    data = get(http, f"/admin/viewer/api/sessions/{recorded.drift}/calls")
    assert data["session"]["session_id"] == recorded.drift and data["session"]["status"] == "closed"
    calls = data["calls"]
    assert [c["node_id"] for c in calls] == [r["metadata"]["node_id"] for r in records]
    assert [c["fidelity"] and c["fidelity"]["class"] for c in calls] == [
        "root", "replay_drift", None, "replay_drift", "replay_drift", "break"]
    assert [c["status"] for c in calls] == ["ok", "ok", "failed", "ok", "ok", "ok"]
    assert [c["policy_version_start"] for c in calls] == [0, 0, 0, 0, 1, 1]
    for call, record in zip(calls, records):
        prompt = record["prompt_token_ids"]
        assert call["fidelity"] == record["metadata"].get("fidelity")
        assert call["prompt_len"] == len(prompt) and call["completion_len"] == len(record["completion_token_ids"])
        shown = set()
        for window in call["prompt_windows"]:
            assert window["ids"] == prompt[window["start"]: window["start"] + len(window["ids"])]
            shown |= set(range(window["start"], window["start"] + len(window["ids"])))
        assert shown >= set(range(max(0, len(prompt) - DEFAULT_TAIL), len(prompt)))  # the end of the prompt
        div = (call["fidelity"] or {}).get("divergence_at")
        if div is not None:
            assert shown >= set(range(max(0, div - DEFAULT_AROUND), min(len(prompt), div + DEFAULT_AROUND)))
        assert call["completion_ids"] == record["completion_token_ids"]
        assert call["completion_logps"] == record["per_token_logps"]
        assert call["completion_mask"] == record["loss_mask"][len(prompt):]
        logps = record["per_token_logps"]
        if logps:
            assert math.isclose(call["logprobs"]["mean"], sum(logps) / len(logps))
            assert call["logprobs"]["min"] == min(logps)
        else:
            assert call["logprobs"]["mean"] is None
    # the drifting calls' replies carry tool calls; the request tail ends with the tool result
    assert calls[1]["response"]["tool_calls"][0]["name"] == "bash"
    assert calls[3]["messages"][-1]["role"] == "tool"
    assert calls[2]["error"]["upstream_body"]["error"]["message"] == ENGINE_ERROR


def test_digest_of_failures_invalid_calls_and_budget_stop(http: httpx.Client, recorded: Recorded) -> None:
    data = get(http, f"/admin/viewer/api/sessions/{recorded.faults}/calls")
    assert data["session"]["stop_reason"] == "max_agent_calls"
    aux, straddled, failed, invalid = data["calls"][0], data["calls"][1], data["calls"][2], data["calls"][4]
    assert aux["call_kind"] == "aux" and aux["aux_rule"] == "no-tools" and aux["fidelity"] is None
    assert straddled["straddled_sync"] is True
    assert (straddled["policy_version_start"], straddled["policy_version_end"]) == (1, 2)
    assert failed["status"] == "failed" and failed["prompt_len"] == 0 and failed["fidelity"] is None
    assert failed["error"]["status"] == 500 and failed["error"]["upstream_status"] == 500
    assert failed["error"]["upstream_body"]["error"]["message"] == ENGINE_ERROR
    assert invalid["status"] == "invalid" and invalid["trainable"] is False and invalid["invalid_reasons"]
    assert invalid["completion_mask"] and set(invalid["completion_mask"]) == {0}
    assert data["calls"][3]["limits"]["max_agent_calls"] == 3


def test_digest_size_follows_the_query(http: httpx.Client, recorded: Recorded) -> None:
    path = f"/admin/viewer/api/sessions/{recorded.drift}/calls"
    small = get(http, path, tail=0, around=4, messages=1, completion=3)["calls"]
    drifted = small[1]
    div = drifted["fidelity"]["divergence_at"]
    assert drifted["prompt_windows"] == [{"start": div - 4, "ids": recorded.admin.records(recorded.drift)[1]
                                          ["prompt_token_ids"][div - 4: div + 4]}]
    assert small[0]["prompt_windows"] == []  # the root has no divergence, and no tail was asked for
    assert len(drifted["messages"]) == 1 and drifted["messages_total"] == 4
    assert len(drifted["completion_ids"]) == 3 and drifted["completion_len"] > 3
    for bad in ({"tail": MAX_SLICE + 1}, {"messages": -1}, {"around": "x"}):
        assert http.get(path, params=bad, headers=AUTH).status_code == 422, bad


def test_token_slices(http: httpx.Client, recorded: Recorded) -> None:
    record = recorded.admin.records(recorded.drift)[4]
    base = f"/admin/viewer/api/sessions/{recorded.drift}/calls/4/tokens"
    prompt = get(http, base, part="prompt", start=10, stop=50)
    assert prompt == {"part": "prompt", "start": 10, "length": len(record["prompt_token_ids"]),
                      "ids": record["prompt_token_ids"][10:50]}
    tail = get(http, base, part="prompt", start=len(record["prompt_token_ids"]) - 3, stop=10**6 // 200)
    assert tail["ids"] == record["prompt_token_ids"][-3:]  # clamped at the end
    completion = get(http, base, part="completion", start=1, stop=4)
    assert completion["ids"] == record["completion_token_ids"][1:4]
    assert completion["logps"] == record["per_token_logps"][1:4] and completion["mask"] == [1, 1, 1]
    assert completion["tokens"] is None
    for params, says in [({"part": "prompt", "start": 5, "stop": 5}, "start < stop"),
                         ({"part": "prompt", "start": 0, "stop": MAX_SLICE + 1}, f"at most {MAX_SLICE} ids"),
                         ({"part": "logits", "start": 0, "stop": 5}, "part"),
                         ({"part": "prompt", "start": -1, "stop": 5}, "start"),
                         ({"part": "prompt"}, "start")]:
        reply = http.get(base, params=params, headers=AUTH)
        assert reply.status_code == 422 and says in reply.text, (params, reply.text)
    missing = http.get(f"/admin/viewer/api/sessions/{recorded.drift}/calls/99/tokens",
                       params={"part": "prompt", "start": 0, "stop": 5}, headers=AUTH)
    assert missing.status_code == 404 and "no call 99" in missing.json()["error"]["message"]


@pytest.mark.parametrize("route", ["calls", "assembly", "calls/0/tokens?part=prompt&start=0&stop=5"])
def test_unknown_session_is_404(route: str, http: httpx.Client) -> None:
    reply = http.get(f"/admin/viewer/api/sessions/no-such-session/{route}", headers=AUTH)
    assert reply.status_code == 404 and "no-such-session" in reply.json()["error"]["message"]


def test_assembly_numbers_are_the_assemblers(http: httpx.Client, recorded: Recorded) -> None:
    records = recorded.admin.records(recorded.drift)
    data = get(http, f"/admin/viewer/api/sessions/{recorded.drift}/assembly")
    expected = {name: stats.model_dump(mode="json") for name, stats in compare_strategies(records).items()}
    assert data["strategies"] == expected
    assert data["strategies"]["split"]["replay_drift"] == 3 and data["strategies"]["split"]["breaks"] == 1
    assert data["strategies"]["realign"]["trainable_ratio"] < data["strategies"]["split"]["trainable_ratio"]
    kinds = {t["to_node"]: t["kind"] for t in data["transitions"]}
    assert kinds[f"{recorded.drift}/5"] == "break" and kinds[f"{recorded.drift}/1"] == "replay_drift"
    assert len(data["chains"]) == 2


def test_long_prompts_are_not_shipped_whole(http: httpx.Client, recorded: Recorded) -> None:
    records = recorded.admin.records(recorded.long)
    assert min(len(r["prompt_token_ids"]) for r in records) > 20_000
    reply = http.get(f"/admin/viewer/api/sessions/{recorded.long}/calls", headers=AUTH)
    assert reply.status_code == 200
    calls = reply.json()["calls"]
    assert calls[1]["fidelity"]["class"] == "replay_drift"
    for call in calls:
        assert sum(len(w["ids"]) for w in call["prompt_windows"]) <= DEFAULT_TAIL + 2 * DEFAULT_AROUND
    assert len(reply.content) < 30_000  # vs. ~54k prompt ids in the records
