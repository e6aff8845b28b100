"""``trace export --format atif``: a session as Harbor's ATIF trajectory, checked by Harbor's own models."""

from __future__ import annotations

import copy
import json

import pytest
from export_records import Records
from harbor_models import HarborRefused, validate

from openenv_harness.export import NothingToExport, export_session
from openenv_harness.export.atif import atif_trajectory

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def _conversation(session: Records) -> list[dict]:
    """A tool episode as an agent sends it: system + user, a tool call, its result, a final answer; an aux
    title call and a failed retry between them."""
    first = session.call()
    first["request"] = {"model": "policy", "tools": TOOLS, "messages": [
        {"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix it."}]}
    call = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    first["response"]["choices"][0]["message"] = {"role": "assistant", "content": "", "reasoning": "Look first.",
                                                  "tool_calls": [call]}
    first["metadata"].update(fidelity={"class": "root", "parent": None}, received_at=1_700_000_000.5,
                             provenance={"harness": "gemini-cli", "harness_version": "0.61.0"})
    session.call(call_kind="aux", aux_rule="title")
    session.call(status="failed")
    second = session.call()
    replayed = {"role": "assistant", "content": "", "reasoning": "Look first.",
                "tool_calls": [{**call, "function": {**call["function"], "arguments": '{"command":"ls"}'}}]}
    second["request"] = {"model": "policy", "tools": TOOLS, "messages": [
        *first["request"]["messages"], replayed, {"role": "tool", "tool_call_id": "call_1", "content": "calc.py"},
        {"role": "user", "content": "Go on."}]}
    second["response"]["choices"][0]["message"] = {"role": "assistant", "content": "Fixed."}
    second["metadata"]["fidelity"] = {"class": "exact", "parent": first["metadata"]["node_id"]}
    return session.records


def test_a_tool_episode_maps_to_steps_with_its_token_evidence(session: Records) -> None:
    records = _conversation(session)
    trajectory = atif_trajectory(records, session_id="s")
    back = validate(trajectory)
    assert back["schema_version"] == "ATIF-v1.7" and back["session_id"] == "s"
    assert back["agent"]["name"] == "gemini-cli" and back["agent"]["version"] == "0.61.0"
    assert back["agent"]["tool_definitions"] == TOOLS
    steps = back["steps"]
    assert [(s["source"], s["message"]) for s in steps] == [
        ("system", "You are an agent."), ("user", "Fix it."), ("agent", ""), ("user", "Go on."), ("agent", "Fixed.")]
    act = steps[2]
    assert act["reasoning_content"] == "Look first." and act["timestamp"].startswith("2023-11-14T22:13:20.5")
    assert act["tool_calls"] == [{"tool_call_id": "call_1", "function_name": "bash", "arguments": {"command": "ls"}}]
    assert act["observation"] == {"results": [{"source_call_id": "call_1", "content": "calc.py"}]}
    agent_records = [records[0], records[3]]
    for step, record in zip([steps[2], steps[4]], agent_records):
        metrics = step["metrics"]
        assert metrics["prompt_token_ids"] == record["prompt_token_ids"]
        assert metrics["completion_token_ids"] == record["completion_token_ids"]
        assert metrics["logprobs"] == record["per_token_logps"]
        assert metrics["extra"]["node_id"] == record["metadata"]["node_id"] and metrics["extra"]["trainable"] is True
    assert steps[4]["metrics"]["extra"]["fidelity"] == "exact"
    assert back["extra"]["aux_calls"] == ["s/1"] and back["extra"]["failed_calls"] == ["s/2"]
    assert back["final_metrics"]["total_steps"] == 5
    assert back["final_metrics"]["total_completion_tokens"] == sum(len(r["completion_token_ids"]) for r in agent_records)


def test_a_rewritten_history_starts_over_and_says_so(session: Records) -> None:
    records = _conversation(session)
    third = session.call()
    third["request"] = {"model": "policy", "messages": [
        {"role": "system", "content": "You are an agent."}, {"role": "user", "content": "What did we do so far?"},
        {"role": "assistant", "content": "Summary: listed files."}, {"role": "user", "content": "Continue."}]}
    third["metadata"]["fidelity"] = {"class": "break", "cause": "history_rewritten"}
    steps = validate(atif_trajectory(records))["steps"]
    tail = steps[5:]
    assert [(s["source"], s["message"]) for s in tail] == [
        ("user", "What did we do so far?"), ("agent", "Summary: listed files."), ("user", "Continue."), ("agent", "ok")]
    assert tail[1]["llm_call_count"] == 0 and "metrics" not in tail[1]  # a summary put back, no call of ours
    assert all(s["extra"]["history_rewritten"] for s in tail)
    assert tail[-1]["metrics"]["extra"]["cause"] == "history_rewritten"


def test_unparseable_arguments_keep_their_text(session: Records) -> None:
    record = session.call()
    record["response"]["choices"][0]["message"]["tool_calls"] = [
        {"id": "c", "type": "function", "function": {"name": "bash", "arguments": "token_id:151657"}}]
    [step] = validate(atif_trajectory(session.records))["steps"][1:]
    assert step["tool_calls"] == [{"tool_call_id": "c", "function_name": "bash", "arguments": {},
                                   "extra": {"raw_arguments": "token_id:151657"}}]


def test_harbor_refuses_what_breaks_its_rules(session: Records) -> None:
    """The validation can fail: a document against ATIF's rules is refused by Harbor's models."""
    good = atif_trajectory(_conversation(session))
    for breakage in ("step ids", "agent-only field", "unknown field"):
        bad = copy.deepcopy(good)
        if breakage == "step ids":
            bad["steps"][1]["step_id"] = 7
        elif breakage == "agent-only field":
            bad["steps"][0]["metrics"] = {"prompt_tokens": 1}
        else:
            bad["steps"][2]["metrics"]["token_ids"] = []
        with pytest.raises(HarborRefused):
            validate(bad)


def test_the_export_format_and_its_refusals(session: Records) -> None:
    records = _conversation(session)
    done = export_session(records, "atif", session_id="s")
    assert json.loads(done.text()) == done.rows and done.rows["steps"]
    only_aux = Records("a")
    only_aux.call(call_kind="aux")
    with pytest.raises(NothingToExport, match="no agent call of this session succeeded"):
        export_session(only_aux.records, "atif")
