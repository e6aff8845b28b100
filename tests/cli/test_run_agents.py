"""``openenv-harness run`` with each agent CLI on the embedded reference engine: the built-in fix-add
task solved with a reward of 1 and recorded as one exact chain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_cli import cli


@pytest.mark.cli
@pytest.mark.slow
def test_run_qwen_code_on_the_embedded_engine(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = cli("run", "--harness", "qwen-code", "--task", "fix-add", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [row] = json.loads((out / "summary.json").read_text())
    assert (row["harness"], row["task"], row["exit_code"], row["reward"], row["agent_calls"], row["aux_calls"]) == (
        "qwen-code", "fix-add", 0, 1.0, 4, 0)
    assert row["fidelity"] == {"exact": 3, "replay_drift": 0, "break": 0} and row["rows"] == 1
    entries = cli("trace", "export", row["session_id"], "--store", str(out / "records.db"), "--format", "entries")
    records = [json.loads(line) for line in entries.stdout.splitlines()]
    assert [r["metadata"]["dialect"] for r in records] == ["chat"] * 4
    for prev, rec in zip(records, records[1:]):  # one exact chain: each prompt extends the last call's tokens
        chain = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert rec["prompt_token_ids"][:len(chain)] == chain
    replayed = [c for m in records[-1]["request"]["messages"] for c in m.get("tool_calls") or []]
    assert [c["function"]["name"] for c in replayed] == ["run_shell_command"] * 3
    assert "sed -i -- " in replayed[1]["function"]["arguments"], "the scripted sed, as its shell runs it"
