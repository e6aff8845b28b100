"""``openenv-harness run`` drives each agent through a built-in task on the embedded engine (a subprocess,
as a user runs it): exit 0, reward 1, one exact chain, and its session as an ATIF trajectory that
Harbor's own models accept with our token evidence on every agent step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CLI = [sys.executable, "-m", "openenv_harness.cli"]


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _harbor_validate(trajectory: dict[str, Any]) -> dict[str, Any]:
    """Harbor's own ATIF models, in their venv (``tests/export/harbor_models.py``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("harbor_models", Path(__file__).parents[1] / "export" / "harbor_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.validate(trajectory)  # type: ignore[no-any-return]


def _run_fix_add(harness: str, out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One fix-add rollout by ``harness``: its summary row and its records, in order; its ATIF
    trajectory is checked against Harbor's models on the way."""
    from openenv_harness.harnesses.registry import get_preset

    done = cli("run", "--harness", harness, "--task", "fix-add", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [row] = json.loads((out / "summary.json").read_text())
    entries = cli("trace", "export", row["session_id"], "--store", str(out / "records.db"), "--format", "entries")
    assert entries.returncode == 0, entries.stderr
    records = [json.loads(line) for line in entries.stdout.splitlines()]
    atif = cli("trace", "export", row["session_id"], "--store", str(out / "records.db"), "--format", "atif")
    assert atif.returncode == 0, atif.stderr
    trajectory = _harbor_validate(json.loads(atif.stdout))
    assert (trajectory["agent"]["name"], trajectory["agent"]["version"]) == (harness, get_preset(harness).version)
    acts = [s for s in trajectory["steps"] if s["source"] == "agent"]
    agent = [r for r in records if r["metadata"]["call_kind"] == "agent"]
    assert [s["metrics"]["completion_token_ids"] for s in acts] == [r["completion_token_ids"] for r in agent]
    assert [s["metrics"]["logprobs"] for s in acts] == [r["per_token_logps"] for r in agent]
    return row, records


def _assert_one_exact_chain(records: list[dict[str, Any]]) -> None:
    for prev, rec in zip(records, records[1:]):  # each prompt extends the last call's tokens
        chain = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert rec["prompt_token_ids"][:len(chain)] == chain


@pytest.mark.cli
@pytest.mark.slow
def test_run_opencode_on_the_embedded_engine(tmp_path: Path) -> None:
    row, records = _run_fix_add("opencode", tmp_path / "run")
    assert (row["harness"], row["task"], row["exit_code"], row["reward"], row["agent_calls"]) == (
        "opencode", "fix-add", 0, 1.0, 4)
    assert row["fidelity"] == {"exact": 3, "replay_drift": 0, "break": 0} and row["rows"] == 1
    _assert_one_exact_chain([r for r in records if r["metadata"]["call_kind"] == "agent"])


@pytest.mark.cli
@pytest.mark.slow
def test_run_grok_cli_on_the_embedded_engine(tmp_path: Path) -> None:
    row, records = _run_fix_add("grok-cli", tmp_path / "run")
    assert (row["harness"], row["task"], row["exit_code"], row["reward"], row["agent_calls"]) == (
        "grok-cli", "fix-add", 0, 1.0, 4)
    assert row["fidelity"]["break"] == 0 and row["fidelity"]["replay_drift"] == 0 and row["rows"] == 1
    assert [r["metadata"]["dialect"] for r in records] == ["chat"] * 4
    assert [r["metadata"]["call_kind"] for r in records] == ["agent"] * 4
    _assert_one_exact_chain(records)


@pytest.mark.cli
@pytest.mark.slow
def test_run_continue_on_the_embedded_engine(tmp_path: Path) -> None:
    row, records = _run_fix_add("continue", tmp_path / "run")
    assert (row["harness"], row["task"], row["exit_code"], row["reward"], row["agent_calls"], row["aux_calls"]) == (
        "continue", "fix-add", 0, 1.0, 4, 0)
    assert row["fidelity"] == {"exact": 3, "replay_drift": 0, "break": 0} and row["rows"] == 1
    assert [r["metadata"]["dialect"] for r in records] == ["chat"] * 4
    _assert_one_exact_chain(records)
    calls = [c["function"]["name"] for r in records for c in r["response"]["choices"][0]["message"].get("tool_calls") or []]
    assert calls == ["Bash"] * 3


@pytest.mark.cli
@pytest.mark.slow
def test_run_mini_swe_agent_on_the_embedded_engine(tmp_path: Path) -> None:
    row, records = _run_fix_add("mini-swe-agent", tmp_path / "run")
    # cat, sed, the tests, then the answer with its submit command
    assert (row["harness"], row["task"], row["exit_code"], row["reward"], row["agent_calls"]) == (
        "mini-swe-agent", "fix-add", 0, 1.0, 4)
    assert row["fidelity"]["break"] == 0 and row["fidelity"]["replay_drift"] == 0 and row["rows"] == 1
    assert row["final_answer"].startswith("Fixed add() in calc.py")
    assert [r["metadata"]["dialect"] for r in records] == ["chat"] * 4
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact", "exact", "exact"]
    _assert_one_exact_chain(records)


@pytest.mark.cli
@pytest.mark.slow
def test_run_qwen_code_on_the_embedded_engine(tmp_path: Path) -> None:
    row, records = _run_fix_add("qwen-code", tmp_path / "run")
    assert (row["harness"], row["task"], row["exit_code"], row["reward"], row["agent_calls"], row["aux_calls"]) == (
        "qwen-code", "fix-add", 0, 1.0, 4, 0)
    assert row["fidelity"] == {"exact": 3, "replay_drift": 0, "break": 0} and row["rows"] == 1
    assert [r["metadata"]["dialect"] for r in records] == ["chat"] * 4
    _assert_one_exact_chain(records)
    replayed = [c for m in records[-1]["request"]["messages"] for c in m.get("tool_calls") or []]
    assert [c["function"]["name"] for c in replayed] == ["run_shell_command"] * 3
    assert "sed -i -- " in replayed[1]["function"]["arguments"], "the scripted sed, as its shell runs it"


@pytest.mark.cli
@pytest.mark.slow
def test_run_kilo_on_the_embedded_engine(tmp_path: Path) -> None:
    row, records = _run_fix_add("kilo", tmp_path / "run")
    # cat, sed, the tests, then the answer
    assert (row["harness"], row["task"], row["exit_code"], row["reward"], row["agent_calls"], row["aux_calls"]) == (
        "kilo", "fix-add", 0, 1.0, 4, 0)
    assert row["fidelity"] == {"exact": 3, "replay_drift": 0, "break": 0} and row["rows"] == 1
    assert [r["metadata"]["dialect"] for r in records] == ["chat"] * 4
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact", "exact", "exact"]
    _assert_one_exact_chain(records)
    replayed = [c for m in records[-1]["request"]["messages"] for c in m.get("tool_calls") or []]
    assert [c["function"]["name"] for c in replayed] == ["bash"] * 3


@pytest.mark.cli
@pytest.mark.slow
def test_run_cline_on_the_embedded_engine(tmp_path: Path) -> None:
    row, records = _run_fix_add("cline", tmp_path / "run")
    assert (row["harness"], row["task"], row["exit_code"], row["reward"], row["agent_calls"], row["aux_calls"]) == (
        "cline", "fix-add", 0, 1.0, 4, 0)
    assert row["fidelity"] == {"exact": 3, "replay_drift": 0, "break": 0} and row["rows"] == 1
    assert [r["metadata"]["dialect"] for r in records] == ["chat"] * 4
    _assert_one_exact_chain(records)
    replayed = [c for m in records[-1]["request"]["messages"] for c in m.get("tool_calls") or []]
    assert [c["function"]["name"] for c in replayed] == ["run_commands"] * 3
    assert json.loads(replayed[0]["function"]["arguments"]) == {"commands": "cat calc.py test_calc.py"}
