"""The Continue CLI preset: config, environment, command and output reading, then the real CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from openenv_harness.harnesses import API_KEY_ENV, HarnessOptions, HarnessSetup, get_preset
from openenv_harness.harnesses.continue_cli import (
    COMPACTION_MARKER,
    NO_GLOBAL_FETCH,
    UNREACHED_CONTEXT,
    parse_continue_output,
)
from openenv_harness.harnesses.install import default_node_prefix, ensure_installed
from openenv_harness.harnesses.launch import place_files
from openenv_harness.rollout.taskset import script_for
from openenv_harness.sandbox import LocalSandbox, ModelEndpoint
from openenv_harness.testing.engine import Script

CONTINUE = get_preset("continue")
HOME = "/sbx/home"
CONFIG = f"{HOME}/.continue/config.yaml"
PERMISSIONS = f"{HOME}/.continue/permissions.yaml"


def _setup(options: HarnessOptions | None = None, headers: dict[str, str] | None = None) -> HarnessSetup:
    endpoint = ModelEndpoint("http://127.0.0.1:9/rollout/s1/v1", "sk-never-in-files", dict(headers or {}))
    return HarnessSetup(endpoint=endpoint, model="Qwen/Qwen3-8B", workdir="/sbx/workdir", home=HOME,
                        context_window=40960, max_output_tokens=2048, options=options or HarnessOptions())


def test_config_stays_in_the_sandbox_home_and_names_the_key() -> None:
    spec = CONTINUE.prepare(_setup(headers={"X-Rollout-Session": "s1"}), "task")
    assert set(spec.files) == {CONFIG, PERMISSIONS}
    assert all("sk-never-in-files" not in text for text in spec.files.values())
    [model] = json.loads(spec.files[CONFIG])["models"]  # JSON is YAML: the CLI's YAML parser reads it
    assert (model["provider"], model["model"], model["roles"]) == ("openai", "Qwen/Qwen3-8B", ["chat"])
    assert model["apiBase"] == "http://127.0.0.1:9/rollout/s1/v1"  # the openai SDK appends /chat/completions
    assert model["apiKey"] == "${{ secrets." + API_KEY_ENV + " }}"
    assert model["requestOptions"]["headers"] == {"X-Rollout-Session": "s1"}
    assert model["defaultCompletionOptions"] == {"contextLength": UNREACHED_CONTEXT, "maxTokens": 2048}
    compacting = json.loads(CONTINUE.prepare(_setup(HarnessOptions(compaction=True)), "task").files[CONFIG])
    assert compacting["models"][0]["defaultCompletionOptions"]["contextLength"] == 40960


def test_permissions_keep_the_write_tools_and_drop_the_web_and_questions() -> None:
    permissions = json.loads(CONTINUE.prepare(_setup(), "task").files[PERMISSIONS])
    assert permissions == {"allow": ["Write", "Edit", "MultiEdit"], "ask": [], "exclude": ["Fetch", "AskQuestion"]}
    web = CONTINUE.prepare(_setup(HarnessOptions(webfetch=True)), "task")
    assert json.loads(web.files[PERMISSIONS])["exclude"] == ["AskQuestion"]
    assert web.env["NODE_OPTIONS"] == "", "the Fetch tool needs Node's global fetch"


def test_environment_points_at_the_session_and_keeps_the_cli_offline() -> None:
    env = CONTINUE.prepare(_setup(), "task").env
    assert env["CONTINUE_GLOBAL_DIR"] == f"{HOME}/.continue" and env["HOME"] == HOME
    assert env[API_KEY_ENV] == "sk-never-in-files"
    assert env["NODE_OPTIONS"] == NO_GLOBAL_FETCH and " " not in NO_GLOBAL_FETCH  # Node splits it on spaces
    assert env["CONTINUE_METRICS_ENABLED"] == "0" and env["FORCE_NO_TTY"] == "true"


def test_command_is_headless_and_carries_the_prompt_as_one_argument() -> None:
    prompt = "-p --fix 'it'\n now"
    spec = CONTINUE.prepare(_setup(HarnessOptions(extra_args=("--verbose",))), prompt, executable="/opt/cn")
    assert spec.argv == ["/opt/cn", "-p", "--config", CONFIG, "--verbose", "--", prompt] and spec.stdin is None
    assert "--auto" not in spec.argv and "--format" not in spec.argv


def test_parse_success_and_errors() -> None:
    ok = parse_continue_output(0, "Fixed add() in calc.py.\n", "")
    assert (ok.ok, ok.exit_code, ok.final_answer) == (True, 0, "Fixed add() in calc.py.")
    failed = parse_continue_output(1, "", '{"status":"error","message":"401 invalid API key for this session"}\n')
    assert (failed.ok, failed.exit_code, failed.error) == (False, 1, "401 invalid API key for this session")
    exited = parse_continue_output(1, "", "")  # the model called the Exit tool
    assert not exited.ok and exited.error == "cn exited with status 1"
    assert "did not exit" in (parse_continue_output(None, "", "").error or "")


def _chat(last_user: str) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": "You are an agent in the Continue CLI."},
                         {"role": "user", "content": "fix it"}, {"role": "assistant", "content": "ok"},
                         {"role": "user", "content": last_user}],
            "tools": [{"type": "function", "function": {"name": "Bash"}}]}


def test_compaction_rule_matches_its_call_with_the_tools_on() -> None:
    [rule] = CONTINUE.aux_rules
    assert rule.matches(_chat(f"{COMPACTION_MARKER}, capturing the key context, decisions made, ..."))
    assert not rule.matches(_chat("fix the failing test"))
    assert rule.as_flat()["no_tools"] is False  # the recorder's rule: the call carries the agent's tools


# -- the real CLI -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def node_prefix() -> Path:
    """Only this CLI is needed here."""
    ensure_installed(["continue"])
    return default_node_prefix()


@pytest.mark.cli
def test_real_continue_runs_a_tool_episode_offline(sandbox: LocalSandbox, recording_stack: tuple,
                                                   run_connects: Any) -> None:
    engine, recorder, admin = recording_stack
    # incremental: the compact argument text sampled here is re-rendered spaced by the template
    # (``tool_args_roundtrip`` false), a restyle full history would record as replay_drift
    session = admin.create_session(harness="continue", prompt_mode="incremental",
                                   aux_rules=[r.as_flat() for r in CONTINUE.aux_rules])
    # the file also says whether NODE_OPTIONS (the CLI's own) reached the tool's shell: it must not
    command = '{"command":"echo harness-proof$NODE_OPTIONS > proof.txt"}'
    turns = [{"tool_calls": [{"name": "bash", "arguments": command}]}, {"content": "FINAL ANSWER: done"}]
    engine.set_script(session["session_id"], Script(turns=script_for(turns, "continue")))
    endpoint = sandbox.model_endpoint(f"{recorder.url}/rollout/{session['session_id']}/v1", session["secret"])
    setup = HarnessSetup(endpoint=endpoint, model="policy", workdir=sandbox.workdir, home=sandbox.home)
    spec = CONTINUE.prepare(setup, "Write the proof file, then report.")
    place_files(sandbox, spec)
    command_result, connects = run_connects(sandbox, spec, 120)
    result = CONTINUE.parse_output(command_result.exit_code, command_result.stdout, command_result.stderr)
    assert result.ok, (result.error, command_result.stdout[-2000:], command_result.stderr[-2000:])
    assert result.final_answer == "FINAL ANSWER: done"
    assert sandbox.read_file("proof.txt") == b"harness-proof\n"
    records = admin.records(session["session_id"])
    assert [r["metadata"]["dialect"] for r in records] == ["chat"] * 2
    assert [r["metadata"]["call_kind"] for r in records] == ["agent"] * 2
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact"]
    assert records[1]["request"]["messages"][-2]["tool_calls"][0]["function"] == {"name": "Bash", "arguments": command}
    tools = {t["function"]["name"] for t in records[0]["request"]["tools"]}
    assert {"Bash", "Read", "Write", "Edit"} <= tools and not tools & {"Fetch", "AskQuestion"}
    assert {(r["request"]["model"], r["request"]["max_tokens"]) for r in records} == {("policy", 4096)}
    if connects is not None:  # every connection the process tree made went to the recorder
        port = int(recorder.url.rsplit(":", 1)[1])
        assert connects and set(connects) == {("127.0.0.1", port)}, connects
