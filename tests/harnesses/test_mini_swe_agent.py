"""The mini-swe-agent preset: config, environment, command and output reading, its scripts, then the real CLI."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from openenv_harness.harnesses import API_KEY_ENV, HarnessOptions, HarnessSetup, get_preset
from openenv_harness.harnesses.install import default_node_prefix, ensure_installed
from openenv_harness.harnesses.launch import place_files
from openenv_harness.harnesses.mini_swe_agent import MARKER, SUBMIT_COMMAND, parse_mini_output
from openenv_harness.rollout.taskset import BUILTIN_TASKS, builtin_task_scripts, reference_model_name, script_for
from openenv_harness.sandbox import LocalSandbox, ModelEndpoint
from openenv_harness.testing.engine import Script

MINI = get_preset("mini-swe-agent")
HOME = "/sbx/home"
CONFIG_DIR = f"{HOME}/.config/mini-swe-agent"
CONFIG = f"{CONFIG_DIR}/openenv-harness.yaml"


@pytest.fixture(scope="module")
def node_prefix() -> Path:
    """This module's agent only: the prefix need not hold the npm agents."""
    ensure_installed(["mini-swe-agent"])
    return default_node_prefix()


def _setup(options: HarnessOptions | None = None, headers: dict[str, str] | None = None) -> HarnessSetup:
    endpoint = ModelEndpoint("http://127.0.0.1:9/rollout/s1/v1", "sk-never-in-files", dict(headers or {}))
    return HarnessSetup(endpoint=endpoint, model="Qwen/Qwen3-8B", workdir="/sbx/workdir", home=HOME,
                        context_window=40960, max_output_tokens=2048, options=options or HarnessOptions())


def test_config_stays_in_the_sandbox_home_and_names_no_key() -> None:
    spec = MINI.prepare(_setup(headers={"X-Rollout-Session": "s1"}), "task")
    assert set(spec.files) == {CONFIG} and "sk-never-in-files" not in spec.files[CONFIG]
    config = json.loads(spec.files[CONFIG])  # JSON, which is YAML
    model = config["model"]
    assert model["model_name"] == "openai/Qwen/Qwen3-8B" and model["model_class"] == "litellm"
    assert model["cost_tracking"] == "ignore_errors"
    assert model["model_kwargs"]["api_base"] == "http://127.0.0.1:9/rollout/s1/v1"
    assert model["model_kwargs"]["max_tokens"] == 2048
    assert model["model_kwargs"]["extra_headers"] == {"X-Rollout-Session": "s1"}
    assert config["environment"] == {"environment_class": "local", "cwd": "/sbx/workdir"}
    assert config["agent"]["cost_limit"] == 0
    overridden = MINI.prepare(_setup(HarnessOptions(config_overrides={"environment": {"timeout": 120}})), "task")
    assert json.loads(overridden.files[CONFIG])["environment"] == {
        "environment_class": "local", "cwd": "/sbx/workdir", "timeout": 120}


def test_environment_points_at_the_session_and_keeps_it_offline() -> None:
    env = MINI.prepare(_setup(), "task").env
    assert env["OPENAI_API_KEY"] == env[API_KEY_ENV] == "sk-never-in-files"
    assert env["MSWEA_GLOBAL_CONFIG_DIR"] == env["MSWEA_CONFIG_DIR"] == CONFIG_DIR and env["HOME"] == HOME
    assert env["MSWEA_CONFIGURED"] == "true", "no first-run wizard"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and env["LITELLM_OFFLINE_MODE"] == "true"
    assert env["MSWEA_COST_TRACKING"] == "ignore_errors"
    assert env["MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT"] == "1"
    assert MINI.prepare(_setup(HarnessOptions(retries=True)), "t").env["MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT"] == "3"


def test_command_is_headless_runs_from_its_config_dir_and_prints_the_trajectory() -> None:
    prompt = "-fix 'it'\n now"
    spec = MINI.prepare(_setup(), prompt, executable="/opt/mini")
    assert spec.stdin is None and spec.argv[:2] == ["sh", "-c"]
    script, agent = spec.argv[2], spec.argv[3:]
    assert agent[0] == "/opt/mini" and agent[-2:] == ["-t", prompt]
    assert {"-y", "--exit-immediately"} <= set(agent) and agent[agent.index("-l") + 1] == "0"
    assert [agent[i + 1] for i, a in enumerate(agent) if a == "-c"] == ["mini.yaml", CONFIG]
    assert agent[agent.index("-o") + 1] == f"{CONFIG_DIR}/trajectory.json"
    assert script.startswith(f"cd {CONFIG_DIR} ") and shlex.quote(MARKER) in script
    assert script.endswith("exit $status")
    with pytest.raises(ValueError, match="no flag that appends"):
        MINI.prepare(_setup(HarnessOptions(system_prompt_suffix="hint")), "task")


def test_the_wrapper_keeps_the_exit_status_and_prints_the_trajectory(tmp_path: Path) -> None:
    fake = tmp_path / "mini"
    fake.write_text('#!/bin/sh\nfor a; do last=$a; done\necho "transcript $last"\n'
                    "echo '{\"info\": {\"exit_status\": \"Submitted\"}}' > trajectory.json\nexit 3\n")
    fake.chmod(0o755)
    setup = HarnessSetup(endpoint=ModelEndpoint("http://127.0.0.1:9/v1", "k"), model="m", workdir=str(tmp_path),
                         home=str(tmp_path / "home"))
    spec = MINI.prepare(setup, "the task", executable=str(fake))
    (tmp_path / "home" / ".config" / "mini-swe-agent").mkdir(parents=True)
    done = subprocess.run(spec.argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 3
    assert done.stdout == f"transcript the task\n\n{MARKER}\n" + '{"info": {"exit_status": "Submitted"}}\n'


def _trajectory(status: str, *messages: dict[str, Any], submission: str = "") -> str:
    info = {"exit_status": status, "submission": submission, "mini_version": "2.4.6"}
    return f"Tool:\n<returncode>\n0\n\n{MARKER}\n" + json.dumps({"info": info, "messages": list(messages)}, indent=2)


def test_parse_success_and_errors() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    said = {"role": "assistant", "content": "All done.", "tool_calls": [call]}
    exit_message = {"role": "exit", "content": "", "extra": {"exit_status": "Submitted"}}
    ok = parse_mini_output(0, _trajectory("Submitted", {"role": "system", "content": "s"}, said, exit_message), "")
    assert (ok.ok, ok.exit_code, ok.final_answer) == (True, 0, "All done.")
    assert ok.tool_calls == [{"id": "c1", "name": "bash", "input": {"command": "ls"}}]
    submitted = parse_mini_output(0, _trajectory("Submitted", said, submission="diff --git a b\n"), "")
    assert submitted.final_answer == "diff --git a b", "the submission, where the submit command printed one"
    formats = parse_mini_output(0, _trajectory("RepeatedFormatError", {"role": "exit", "content": "RepeatedFormatError"}),
                                "")
    assert (formats.ok, formats.exit_code, formats.error) == (False, 1, "mini ended with RepeatedFormatError")
    crashed = parse_mini_output(1, _trajectory("BadRequestError", {"role": "exit", "content": "budget"}),
                                "Traceback...\nlitellm.BadRequestError: max_agent_calls reached\n")
    assert (crashed.ok, crashed.exit_code, crashed.error) == (False, 1, "litellm.BadRequestError: max_agent_calls reached")
    assert not parse_mini_output(0, "transcript only\n", "").ok
    assert "did not exit" in (parse_mini_output(None, "", "").error or "")


def test_its_script_ends_with_the_submit_command_and_the_others_are_unchanged() -> None:
    turns = BUILTIN_TASKS["fix-add"].reference_script
    mini = script_for(turns, "mini-swe-agent")
    assert mini[:-1] == script_for(turns, "pi")[:-1] == [dict(t) for t in turns[:-1]]
    assert mini[-1] == {"content": turns[-1]["content"],
                        "tool_calls": [{"name": "bash", "arguments": {"command": SUBMIT_COMMAND}}]}
    assert script_for(turns, "pi")[-1] == {"content": turns[-1]["content"]}
    assert script_for([{"content": "mid"}, *turns], "mini-swe-agent")[0] == {"content": "mid"}, "only the last turn"
    assert reference_model_name("fix-add", "mini-swe-agent") == "reference/fix-add/submit"
    assert [reference_model_name("fix-add", h) for h in ("pi", "opencode", "codex", "claude-code", "gemini-cli")] == [
        "reference/fix-add", "reference/fix-add", "reference/fix-add/exec_command", "reference/fix-add/Bash",
        "reference/fix-add/run_shell_command"]
    scripts = builtin_task_scripts([BUILTIN_TASKS["fix-add"]])
    assert scripts["reference/fix-add/submit"] == mini and scripts["reference/fix-add"] == script_for(turns, "pi")


# -- the real CLI -----------------------------------------------------------------------------------


@pytest.mark.cli
@pytest.mark.parametrize("prompt_mode", ["full_history", "incremental"])
def test_real_mini_swe_agent_runs_a_tool_episode_offline(sandbox: LocalSandbox, recording_stack: tuple,
                                                         run_connects: Any, prompt_mode: str) -> None:
    engine, recorder, admin = recording_stack
    session = admin.create_session(harness="mini-swe-agent", prompt_mode=prompt_mode)
    turns = [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo harness-proof > proof.txt"}}]},
             {"content": "FINAL ANSWER: done"}]
    engine.set_script(session["session_id"], Script(turns=script_for(turns, "mini-swe-agent")))
    endpoint = sandbox.model_endpoint(f"{recorder.url}/rollout/{session['session_id']}/v1", session["secret"])
    setup = HarnessSetup(endpoint=endpoint, model="policy", workdir=sandbox.workdir, home=sandbox.home)
    spec = MINI.prepare(setup, "Write the proof file, then report.")
    place_files(sandbox, spec)
    command, connects = run_connects(sandbox, spec, 180)
    result = MINI.parse_output(command.exit_code, command.stdout, command.stderr)
    assert result.ok, (result.error, command.stdout[-2000:], command.stderr[-2000:])
    assert result.final_answer == "FINAL ANSWER: done"
    assert [c["input"] for c in result.tool_calls] == [{"command": "echo harness-proof > proof.txt"},
                                                       {"command": SUBMIT_COMMAND}]
    assert sandbox.read_file("proof.txt") == b"harness-proof\n"
    records = admin.records(session["session_id"])
    assert [r["metadata"]["dialect"] for r in records] == ["chat"] * 2
    assert [r["metadata"]["call_kind"] for r in records] == ["agent"] * 2
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact"]
    assert [t["function"]["name"] for t in records[0]["request"]["tools"]] == ["bash"]
    assert {r["request"]["model"] for r in records} == {"policy"}, "LiteLLM's openai/ prefix is not sent"
    assert sorted(p.name for p in Path(sandbox.home, ".config", "mini-swe-agent").iterdir()) == [
        "openenv-harness.yaml", "trajectory.json"]
    if connects is not None:  # every connection the process tree made went to the recorder
        port = int(recorder.url.rsplit(":", 1)[1])
        assert connects and set(connects) == {("127.0.0.1", port)}, connects
