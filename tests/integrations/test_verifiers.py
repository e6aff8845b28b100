"""verifiers 0.4's own message graph, fed with records a real recorder made, against our assembler.

Every session below is recorded through the recorder in front of the reference engine. verifiers
runs in its own environment (``vf_probe.py``), once for all sessions; the assembler runs here on
the same records, and the two views are compared sample by sample.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from recorded_sessions import SessionRun, opening, run_verifiers, tool_script, verifiers_python, write_jsonl

from openenv_harness.assembly import assemble_session
from openenv_harness.contract import is_training_entry
from openenv_harness.recorder import RecorderClient
from openenv_harness.testing.engine import EngineServer, Script

pytestmark = pytest.mark.compat

PROBE = Path(__file__).with_name("vf_probe.py")
SUMMARIZER = "You are a context summarization agent. Summarize the conversation so far."


def _one_task(admin: RecorderClient, engine: EngineServer, model: str, script: Script,
              **agent_options: Any) -> list[dict[str, Any]]:
    """A session in which the agent does one task start to finish; its records."""
    run = SessionRun(admin, engine, model, script)
    agent = run.agent(**agent_options)
    try:
        agent.run(opening())
    finally:
        agent.close()
    return run.records()


def _record_sessions(admin: RecorderClient, engine: EngineServer) -> dict[str, list[dict[str, Any]]]:
    sessions = {
        "clean": _one_task(admin, engine, "vf-clean", tool_script(3)),
        "drift_args": _one_task(admin, engine, "vf-drift-args", tool_script(3, spaced_args=True)),
        "drift_segmentation": _one_task(admin, engine, "vf-drift-segmentation",
                                        tool_script(2, segmentation="noncanonical")),
        "renamed_ids": _one_task(admin, engine, "vf-renamed-ids", tool_script(3), rename_tool_ids=True),
    }

    # Compaction as OpenCode does it: a summarizer call without tools (aux), then a fresh context.
    run = SessionRun(admin, engine, "vf-compaction", tool_script(4))
    agent = run.agent()
    history = agent.run(opening())
    transcript = "\n".join(str(m.get("content") or "") for m in history)
    summary = agent.call([{"role": "system", "content": SUMMARIZER}, {"role": "user", "content": transcript}],
                         tools=False)
    agent.run(opening(f"Summary of the work so far: {summary['content']}\nContinue the task."))
    agent.close()
    sessions["compaction"] = run.records()

    untrainable = copy.deepcopy(sessions["clean"])
    untrainable[1]["metadata"]["trainable"] = False
    sessions["untrainable"] = untrainable

    bad_response = copy.deepcopy(sessions["clean"])
    bad_response[1]["response"]["choices"] = []
    sessions["bad_response"] = bad_response

    sessions["two_sessions"] = sessions["clean"] + sessions["drift_args"]
    sessions["bad_reward"] = sessions["clean"]
    sessions["only_aux"] = [r for r in sessions["compaction"] if not is_training_entry(r)]
    return sessions


REWARDS: dict[str, float] = {"clean": 1.0, "bad_reward": float("nan")}


@pytest.fixture(scope="module")
def scenarios(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    verifiers_python()  # skip before starting any server
    sessions = _record_sessions(request.getfixturevalue("admin"), request.getfixturevalue("engine"))
    folder = tmp_path_factory.mktemp("vf-records")
    manifest = {
        name: {"records": str(write_jsonl(folder / f"{name}.jsonl", records)), "reward": REWARDS.get(name)}
        for name, records in sessions.items()
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    done = run_verifiers([str(PROBE), str(folder / "manifest.json")])
    assert done.returncode == 0, done.stderr[-3000:]
    return sessions, json.loads(done.stdout)


def _agent_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if is_training_entry(r)]


def _sampled(branch: dict[str, Any]) -> tuple[list[int], list[float]]:
    columns = zip(branch["token_ids"], branch["sampled_mask"], branch["logprobs"], strict=True)
    pairs = [(token, logprob) for token, sampled, logprob in columns if sampled]
    return [t for t, _ in pairs], [lp for _, lp in pairs]


def test_bridge_imports_neither_openenv_nor_the_recorder(scenarios) -> None:
    _, results = scenarios
    assert results["_forbidden_modules"] == []


def test_clean_chain_is_one_branch_holding_every_sampled_token(scenarios) -> None:
    sessions, results = scenarios
    records = _agent_records(sessions["clean"])
    assembled = assemble_session(sessions["clean"], strategy="split")
    assert len(records) == 4 and len(assembled.chains) == 1 and len(assembled.traces) == 1
    assert {t.kind for t in assembled.transitions} == {"exact"}

    result = results["clean"]
    (branch,) = result["branches"]
    last = records[-1]
    assert branch["token_ids"] == last["prompt_token_ids"] + last["completion_token_ids"]
    sampled_ids, sampled_logprobs = _sampled(branch)
    assert sampled_ids == [t for r in records for t in r["completion_token_ids"]]
    assert sampled_logprobs == [lp for r in records for lp in r["per_token_logps"]]
    assert result["comparison"]["matched"] == [{"branch": 0, "trace": 0}]
    assert result["comparison"]["unmatched_branches"] == result["comparison"]["unmatched_traces"] == []
    assert result["reloaded_branches"] == result["branches"]
    assert result["num_calls"] == result["num_turns"] == 4 and result["call_nodes_sampled"]
    assert result["rewards"] == {"verify": 1.0} and result["trace_reward"] == 1.0
    assert result["stop_condition"] == "agent_completed" and result["is_completed"]
    assert result["info"]["node_ids"] == [r["metadata"]["node_id"] for r in records]


@pytest.mark.parametrize("name", ["drift_args", "drift_segmentation"])
def test_replay_drift_in_a_message_equal_prefix_splits_like_split(scenarios, name: str) -> None:
    """One chain for our grouping, several branches for verifiers: its token check truncates the
    message-hash prefix exactly where our ``split`` closes a sample, so the samples agree."""
    sessions, results = scenarios
    assembled = assemble_session(sessions[name], strategy="split")
    drifts = [t for t in assembled.transitions if t.kind == "replay_drift"]
    assert len(assembled.chains) == 1 and drifts
    assert len(assembled.traces) == 1 + len(drifts)

    result = results[name]
    assert len(result["branches"]) == len(assembled.traces)
    assert result["comparison"]["unmatched_branches"] == result["comparison"]["unmatched_traces"] == []
    assert result["comparison"]["branch_sampled_tokens"] == assembled.stats.trainable_tokens
    assert result["reloaded_branches"] == result["branches"]


def test_compaction_break_gives_two_branches_and_aux_calls_stay_out(scenarios) -> None:
    sessions, results = scenarios
    assembled = assemble_session(sessions["compaction"], strategy="split")
    breaks = [t for t in assembled.transitions if t.kind == "break"]
    assert len(assembled.chains) == 2 and len(breaks) == 1 and breaks[0].cause == "history_rewrite"
    assert assembled.stats.excluded == {"aux": 1}

    result = results["compaction"]
    assert len(result["branches"]) == 2
    assert result["comparison"]["unmatched_branches"] == result["comparison"]["unmatched_traces"] == []
    assert result["info"]["excluded"] == {"aux": 1}
    assert result["num_calls"] == len(_agent_records(sessions["compaction"]))


def test_renamed_tool_ids_split_verifiers_but_not_our_chain(scenarios) -> None:
    """Where the two groupings differ: ids the template never renders keep our token chain exact,
    but change verifiers' message hashes, so every call opens a branch of its own. No sampled
    token is lost; the history comes back as context in each later branch."""
    sessions, results = scenarios
    records = _agent_records(sessions["renamed_ids"])
    assembled = assemble_session(sessions["renamed_ids"], strategy="split")
    assert len(assembled.chains) == 1 and len(assembled.traces) == 1
    assert {t.kind for t in assembled.transitions} == {"exact"}

    result = results["renamed_ids"]
    assert len(result["branches"]) == len(records) == 4
    for branch, record in zip(result["branches"], records, strict=True):
        assert branch["token_ids"] == record["prompt_token_ids"] + record["completion_token_ids"]
        assert _sampled(branch) == (record["completion_token_ids"], record["per_token_logps"])
    comparison = result["comparison"]
    assert comparison["matched"] == [] and comparison["unmatched_traces"] == [0]
    assert comparison["branch_sampled_tokens"] == comparison["trace_trainable_tokens"]
    assert result["branches"][-1]["token_ids"] == assembled.traces[0].input_ids


def test_untrainable_record_becomes_context_in_the_branch(scenarios) -> None:
    sessions, results = scenarios
    assembled = assemble_session(sessions["untrainable"], strategy="split")
    result = results["untrainable"]
    assert result["comparison"]["matched"] == [{"branch": 0, "trace": 0}]
    untrained = _agent_records(sessions["untrainable"])[1]["completion_token_ids"]
    assert result["comparison"]["branch_sampled_tokens"] == assembled.stats.trainable_tokens
    assert assembled.stats.trainable_tokens == results["clean"]["comparison"]["branch_sampled_tokens"] - len(untrained)


def test_unscored_session_keeps_none_but_verifiers_total_reads_zero(scenarios) -> None:
    _, results = scenarios
    assert results["drift_args"]["rewards"] == {"verify": None}
    assert results["drift_args"]["trace_reward"] == 0.0  # verifiers sums scored rewards only


def test_records_verifiers_cannot_take_fail_with_the_record_named(scenarios) -> None:
    sessions, results = scenarios
    error = results["bad_response"]["error"]
    assert error["type"] == "VerifiersIntegrationError"
    assert sessions["bad_response"][1]["metadata"]["node_id"] in error["message"]
    assert results["two_sessions"]["error"]["type"] == "AssemblyError"
    assert "several sessions" in results["two_sessions"]["error"]["message"]
    assert results["bad_reward"]["error"]["type"] == "VerifiersIntegrationError"
    assert "finite number" in results["bad_reward"]["error"]["message"]


def test_session_without_agent_calls_is_a_trace_without_branches(scenarios) -> None:
    _, results = scenarios
    result = results["only_aux"]
    assert result["branches"] == [] and result["num_calls"] == 0
    assert result["info"]["excluded"] == {"aux": 1}

