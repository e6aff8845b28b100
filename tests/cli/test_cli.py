"""The openenv-harness command, run as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "openenv_harness.cli"]


def _harbor_validate(trajectory: dict) -> dict:
    """Harbor's own ATIF models, in their venv (``tests/export/harbor_models.py``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("harbor_models", Path(__file__).parents[1] / "export" / "harbor_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.validate(trajectory)


def cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "run"
    done = cli("run", "--harness", "pi", "--task", "write-greeting,fix-add", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rollouts" in done.stdout and "records:" in done.stdout
    assert "template: certified" in done.stdout  # the served template's certification beside the chains
    return out


@pytest.mark.cli
def test_run_writes_records_and_a_summary(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [(r["harness"], r["task"], r["exit_code"], r["reward"]) for r in summary] == [
        ("pi", "write-greeting", 0, 1.0), ("pi", "fix-add", 0, 1.0)]
    assert all(r["fidelity"]["break"] == 0 and r["rows"] == 1 for r in summary)
    assert (run_dir / "records.db").is_file()


@pytest.mark.cli
@pytest.mark.slow
def test_run_codex_and_claude_code_on_the_embedded_engine(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = cli("run", "--harness", "codex,claude-code", "--task", "fix-add", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["harness"], r["task"], r["exit_code"], r["reward"], r["agent_calls"]) for r in summary] == [
        ("codex", "fix-add", 0, 1.0, 4), ("claude-code", "fix-add", 0, 1.0, 4)]
    assert all(r["fidelity"]["break"] == 0 and r["fidelity"]["replay_drift"] == 0 and r["rows"] == 1 for r in summary)
    for row in summary:  # each session as an ATIF trajectory Harbor's models accept
        atif = cli("trace", "export", row["session_id"], "--store", str(out / "records.db"), "--format", "atif")
        assert atif.returncode == 0, atif.stderr
        trajectory = _harbor_validate(json.loads(atif.stdout))
        assert trajectory["agent"]["name"] == row["harness"]
        assert len([s for s in trajectory["steps"] if s["source"] == "agent"]) == 4


@pytest.mark.cli
@pytest.mark.slow
def test_run_gemini_cli_on_the_embedded_engine(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = cli("run", "--harness", "gemini-cli", "--task", "fix-add", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [row] = json.loads((out / "summary.json").read_text())
    assert (row["harness"], row["task"], row["exit_code"], row["reward"], row["agent_calls"]) == (
        "gemini-cli", "fix-add", 0, 1.0, 4)
    assert row["fidelity"]["break"] == 0 and row["fidelity"]["replay_drift"] == 0 and row["rows"] == 1
    entries = cli("trace", "export", row["session_id"], "--store", str(out / "records.db"), "--format", "entries")
    records = [json.loads(line) for line in entries.stdout.splitlines()]
    assert [r["metadata"]["dialect"] for r in records] == ["gemini"] * 4
    for prev, rec in zip(records, records[1:]):  # one exact chain: each prompt extends the last call's tokens
        chain = prev["prompt_token_ids"] + prev["completion_token_ids"]
        assert rec["prompt_token_ids"][:len(chain)] == chain
    atif = cli("trace", "export", row["session_id"], "--store", str(out / "records.db"), "--format", "atif")
    assert atif.returncode == 0, atif.stderr
    trajectory = _harbor_validate(json.loads(atif.stdout))
    assert trajectory["agent"]["name"] == "gemini-cli" and trajectory["agent"]["version"] == "0.61.0"
    acts = [s for s in trajectory["steps"] if s["source"] == "agent"]
    assert [s["metrics"]["completion_token_ids"] for s in acts] == [r["completion_token_ids"] for r in records]
    assert [s["metrics"]["prompt_token_ids"] for s in acts] == [r["prompt_token_ids"] for r in records]
    assert [c["function_name"] for s in acts for c in s.get("tool_calls", [])] == ["run_shell_command"] * 3
    assert all(s["observation"]["results"] for s in acts[:3])


@pytest.mark.cli
def test_trace_list_show_export(run_dir: Path) -> None:
    store = str(run_dir / "records.db")
    sid = json.loads((run_dir / "summary.json").read_text())[1]["session_id"]
    listed = cli("trace", "list", "--store", store)
    assert listed.returncode == 0 and sid in listed.stdout
    shown = cli("trace", "show", sid, "--store", store, "--delta")
    assert shown.returncode == 0 and "exact" in shown.stdout and "split" in shown.stdout
    entries = cli("trace", "export", sid, "--store", store, "--format", "entries")
    rows = [json.loads(line) for line in entries.stdout.splitlines()]
    assert len(rows) == 4 and all(r["metadata"]["session_id"] == sid for r in rows)
    training = json.loads(cli("trace", "export", sid, "--store", store, "--format", "training").stdout)
    from openenv.core.harness import TrainingTrace

    assert len(TrainingTrace.model_validate(training).turns) == 4
    harness = json.loads(cli("trace", "export", sid, "--store", store, "--format", "harness").stdout)
    assert len(harness) == 1 and harness[0]["prompt_ids"] == rows[0]["prompt_token_ids"]
    assert sum(harness[0]["loss_mask"]) == sum(len(r["completion_token_ids"]) for r in rows)
    assert harness[0]["reward"] == 1.0, "the scored rollout's reward travels with its rows"
    atif = _harbor_validate(json.loads(cli("trace", "export", sid, "--store", store, "--format", "atif").stdout))
    assert [s["metrics"]["logprobs"] for s in atif["steps"] if s["source"] == "agent"] == [
        r["per_token_logps"] for r in rows]
    assert all(seg["logprobs_are_policy"] for seg in harness[0]["metadata"]["segments"])
    unknown = cli("trace", "export", "no-such-session", "--store", store)
    assert unknown.returncode == 2 and "no records for session no-such-session" in unknown.stderr


@pytest.mark.slow  # five CLI processes, each a fresh interpreter (~8.5 s)
def test_errors_are_one_clear_line(tmp_path: Path) -> None:
    missing = cli("trace", "list", "--store", str(tmp_path / "nope.db"))
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: no record store") and "Traceback" not in missing.stderr
    assert "hint:" in missing.stderr
    bad = cli("run", "--task", "no-such-task")
    assert bad.returncode == 2 and "unknown task" in bad.stderr and "Traceback" not in bad.stderr
    needs_model = cli("run", "--engine-url", "http://127.0.0.1:9")
    assert needs_model.returncode == 2 and "--model" in needs_model.stderr
    priority = cli("serve", "--store", str(tmp_path / "r.db"), "--index-priority", "realtime")
    assert priority.returncode == 2 and "--index-priority" in priority.stderr and "Traceback" not in priority.stderr
    debug = cli("trace", "list", "--store", str(tmp_path / "nope.db"), "--debug")
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_the_command_starts_without_importing_the_rollout_stack() -> None:
    # --help, serve and trace must not pay for the rollout machinery (OpenEnv's harness and server
    # modules take seconds to import); a run imports it when it starts
    probe = ("import sys, openenv_harness.cli.app; "
             "print(sorted(m for m in sys.modules if m.startswith(('openenv_harness.rollout', 'openenv.core'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow  # a doctor process: it starts and probes engines (8-16 s)
def test_doctor_reports_the_harnesses() -> None:
    done = cli("doctor")
    assert "harness pi" in done.stdout and "harness opencode" in done.stdout and "python" in done.stdout
    assert "harness codex" in done.stdout and "harness claude-code" in done.stdout
    [gemini] = [ln for ln in done.stdout.splitlines() if "harness gemini-cli" in ln]
    assert "dialect gemini" in gemini, "each agent's line names the dialect it speaks"
    [line] = [ln for ln in done.stdout.splitlines() if "│ engine" in ln]
    assert "skipped" in line and "not checked" in line, "a doctor that checked no engine says so"


def _row(table: str, check: str) -> str:
    """One row of the doctor's table, its wrapped continuation lines joined, without the box lines."""
    lines = table.splitlines()
    [start] = [i for i, ln in enumerate(lines) if ln.startswith(f"│ {check} ")]
    row = [lines[start]]
    for ln in lines[start + 1:]:
        if not ln.startswith("│ ") or ln.split("│")[1].strip():
            break
        row.append(ln)
    return " ".join(" ".join(ln.replace("│", " ") for ln in row).split())


@pytest.mark.slow  # a doctor process: it starts and probes engines (8-16 s)
def test_doctor_reports_the_container_sandbox(tmp_path: Path) -> None:
    """Its row names the engine and the image where both are there, else what is missing and how to fix it;
    a machine without them is still ready for the local sandbox, so the row fails nothing."""
    done = cli("doctor")
    row = _row(done.stdout, "container sandbox")
    assert row.startswith("container sandbox yes docker") and "image openenv-harness/sandbox:" in row or (
        row.startswith("container sandbox no") and "install" in row), row

    # an engine installed whose daemon does not answer: named, with the remedy
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///x.sock' >&2\nexit 1\n")
    (fake / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.path.dirname(sys.executable)}"}
    done = subprocess.run([*CLI, "doctor"], capture_output=True, text=True, timeout=300, env=env)
    row = _row(done.stdout, "container sandbox")
    assert row.startswith("container sandbox no docker is installed but its daemon does not answer: Cannot connect "
                          "to the Docker daemon"), row
    assert "apt-get install docker.io" in row and "podman" in row, row

    # none installed at all
    env["PATH"] = os.path.dirname(sys.executable)
    (fake / "docker").unlink()
    done = subprocess.run([*CLI, "doctor"], capture_output=True, text=True, timeout=300, env=env)
    row = _row(done.stdout, "container sandbox")
    assert row.startswith("container sandbox no no container engine (docker or podman) is installed"), row


@pytest.mark.slow  # a doctor process: it starts and probes engines (8-16 s)
def test_doctor_names_an_engine_that_is_not_there(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    done = cli("doctor", "--engine-url", f"http://127.0.0.1:{port}")
    assert done.returncode == 1
    [line] = [ln for ln in done.stdout.splitlines() if "│ engine" in ln]
    assert "│ no" in line and "unreachable" in line, line
    assert "engine version" not in done.stdout, "nothing is reported of an engine that did not answer"


@pytest.mark.slow  # a doctor process: it starts and probes engines (8-16 s)
def test_doctor_checks_an_engine_for_token_evidence() -> None:
    from openenv_harness.testing.engine import EngineServer

    with EngineServer() as engine:
        done = cli("doctor", "--engine-url", engine.url)
    assert "tpl1-" in done.stdout, done.stdout
    [line] = [ln for ln in done.stdout.splitlines() if "token ids + logprobs" in ln]
    assert "│ yes │ ok" in line, line  # the evidence is read from the whole reply, as the engine sent it
    [line] = [ln for ln in done.stdout.splitlines() if "template certification" in ln]
    assert "certified (probed via render)" in line, line  # the chat route's own rendering
    assert done.returncode == 0, done.stdout


@pytest.mark.slow  # a doctor process: it starts and probes engines (8-16 s)
def test_doctor_measures_the_engines_logprobs_mode() -> None:
    """Raw or processed is measured on the engine (two one-token calls at two temperatures), not assumed."""
    from openenv_harness.testing.engine import EngineConfig, EngineServer

    for mode in ("raw_logprobs", "processed_logprobs"):
        with EngineServer(EngineConfig(logprobs_mode=mode)) as engine:
            done = cli("doctor", "--engine-url", engine.url)
        [line] = [ln for ln in done.stdout.splitlines() if "logprobs mode" in ln]
        assert f"│ yes │ {mode} (measured: top-5 gap" in line, line


@pytest.mark.slow  # a doctor process: it starts and probes engines (8-16 s)
def test_doctor_exits_non_zero_when_the_engine_gives_no_token_evidence() -> None:
    """An engine (or a router in front of it) that drops the ids fails the check, and the command."""
    from openenv_harness.testing.engine import EngineServer, Fault

    with EngineServer() as engine:
        engine.add_fault("reference-model", Fault(missing_token_ids=True))
        done = cli("doctor", "--engine-url", engine.url)
    [line] = [ln for ln in done.stdout.splitlines() if "token ids + logprobs" in ln]
    assert "│ no  │" in line and "no prompt_token_ids" in line, line
    assert done.returncode == 1, (done.returncode, done.stdout)
    assert "token ids + logprobs" in done.stdout and "tpl1-" in done.stdout, done.stdout


def test_serve_prints_a_one_time_viewer_link_and_never_the_given_token(tmp_path: Path) -> None:
    import re
    import time

    import httpx

    from openenv_harness.recorder.serving import free_port

    token, port = "serve-admin-token-0123456789abcdef", free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([*CLI, "serve", "--store", str(tmp_path / "r.db"), "--port", str(port), "--admin-token",
                             token, "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout is not None
        printed = []
        while not any("trace viewer:" in line for line in printed):
            line = proc.stdout.readline()
            assert line, "serve ended before printing the viewer link: " + "".join(printed)
            printed.append(line)
        link = re.search(r"(http://\S+/viewer/login\?code=\S+)", printed[-1])
        assert link, printed
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "serve did not start"
                time.sleep(0.1)
        first = httpx.get(link.group(1), timeout=10)
        assert first.status_code == 303 and first.cookies.get("oeh_admin")
        assert httpx.get(link.group(1), timeout=10).status_code == 401  # one time only
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert token not in "".join(printed) + out + err


@pytest.mark.cli
def test_run_serves_the_chat_template_it_is_given(run_dir: Path, tmp_path: Path) -> None:
    """``--chat-template`` reaches the embedded engine: the records name another template than the
    default run's, and the agent still solves its task (TRL's own Qwen3 template, read from TRL)."""
    trl = pytest.importorskip("trl")
    template = Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja"
    assert template.is_file(), "TRL ships its chat templates"
    out = tmp_path / "run"
    done = cli("run", "--harness", "pi", "--task", "fix-add", "--chat-template", str(template), "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [report] = json.loads((out / "summary.json").read_text())
    assert report["reward"] == 1.0

    def fingerprint(store: Path, session: str) -> str:
        rows = cli("trace", "export", session, "--store", str(store)).stdout.splitlines()
        return json.loads(rows[0])["metadata"]["provenance"]["template_fingerprint"]

    default_session = json.loads((run_dir / "summary.json").read_text())[0]["session_id"]
    assert fingerprint(out / "records.db", report["session_id"]) != fingerprint(run_dir / "records.db", default_session)
    assert "[probed via render]" in done.stdout, "the certification line is printed whole"
    missing = cli("run", "--chat-template", str(tmp_path / "none.jinja"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr


@pytest.mark.cli
def test_a_budget_stop_is_an_outcome_not_a_failure(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = cli("run", "--harness", "pi", "--task", "fix-add", "--max-agent-calls", "2", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [report] = json.loads((out / "summary.json").read_text())
    assert report["stop_reason"] == "max_agent_calls" and report["agent_calls"] == 2
    assert report["reward"] is not None, "a budget stop is scored: the policy spent its budget"


@pytest.mark.cli
def test_run_sets_both_prompt_modes_side_by_side_and_says_what_a_trainer_gets(tmp_path: Path) -> None:
    """Sampling that the template would tokenize otherwise (noncanonical): full history drifts where the
    agent replays it, incremental continues from the exact ids -- one row per rollout, every id trainable."""
    out = tmp_path / "run"
    done = cli("run", "--harness", "pi", "--task", "fix-add", "--segmentation", "noncanonical",
               "--prompt-mode", "incremental,full_history", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    by_mode = {r["prompt_mode"]: r for r in summary}
    assert sorted(by_mode) == ["full_history", "incremental"] and all(r["reward"] == 1.0 for r in summary)
    incremental, full = by_mode["incremental"]["training"], by_mode["full_history"]["training"]
    assert incremental["strategies"]["split"]["rows"] == 1
    assert incremental["strategies"]["split"]["trainable_tokens"] == incremental["sampled_tokens"]
    assert full["strategies"]["split"]["rows"] > 1
    lines = [line for line in done.stdout.splitlines() if line.startswith("what a trainer gets")]
    assert len(lines) == 2 and lines[0].startswith("what a trainer gets incremental: 1 rollout(s) -> 1 row(s), 100% of")
    assert lines[1].startswith(f"what a trainer gets full history: 1 rollout(s) -> {full['strategies']['split']['rows']} row(s)")
    bad = cli("run", "--prompt-mode", "incremental,partial")
    assert bad.returncode == 2 and "unknown prompt mode 'partial'" in bad.stderr
