"""The Grok CLI preset: settings, environment, command and output reading, then the real CLI."""

from __future__ import annotations

import json
from typing import Any

import pytest

from openenv_harness.harnesses import API_KEY_ENV, HarnessOptions, HarnessSetup, get_preset
from openenv_harness.harnesses.grok_cli import MAX_TOOL_ROUNDS, parse_grok_output
from openenv_harness.harnesses.launch import place_files
from openenv_harness.rollout.taskset import script_for
from openenv_harness.sandbox import LocalSandbox, ModelEndpoint
from openenv_harness.testing.engine import Script

GROK = get_preset("grok-cli")
HOME = "/sbx/home"
SETTINGS = f"{HOME}/.grok/user-settings.json"


def _setup(options: HarnessOptions | None = None, headers: dict[str, str] | None = None) -> HarnessSetup:
    endpoint = ModelEndpoint("http://127.0.0.1:9/rollout/s1/v1", "sk-never-in-files", dict(headers or {}))
    return HarnessSetup(endpoint=endpoint, model="Qwen/Qwen3-8B", workdir="/sbx/workdir", home=HOME,
                        context_window=40960, max_output_tokens=2048, options=options or HarnessOptions())


def test_settings_stay_in_the_sandbox_home_and_hold_no_key() -> None:
    spec = GROK.prepare(_setup(), "task")
    assert set(spec.files) == {SETTINGS} and "sk-never-in-files" not in spec.files[SETTINGS]
    settings = json.loads(spec.files[SETTINGS])
    assert settings == {"baseURL": "http://127.0.0.1:9/rollout/s1/v1", "defaultModel": "Qwen/Qwen3-8B",
                        "models": ["Qwen/Qwen3-8B"], "settingsVersion": 2}
    assert "apiKey" not in settings
    merged = GROK.prepare(_setup(HarnessOptions(config_overrides={"models": ["a", "b"]})), "task")
    assert json.loads(merged.files[SETTINGS])["models"] == ["a", "b"]


def test_environment_points_at_the_session_and_keeps_morph_off() -> None:
    env = GROK.prepare(_setup(), "task").env
    assert env["GROK_BASE_URL"] == "http://127.0.0.1:9/rollout/s1/v1"  # the SDK appends /chat/completions
    assert env["GROK_API_KEY"] == env[API_KEY_ENV] == "sk-never-in-files"
    assert env["GROK_MODEL"] == "Qwen/Qwen3-8B" and env["GROK_MAX_TOKENS"] == "2048"
    assert env["HOME"] == HOME and env["XDG_CONFIG_HOME"] == f"{HOME}/.config"
    assert env["MORPH_API_KEY"] == "", "set and empty: no Morph tool, and no .env can turn it on"
    with pytest.raises(ValueError, match="extra headers"):
        GROK.prepare(_setup(headers={"X-Rollout-Session": "s1"}), "task")


def test_command_is_headless_and_carries_the_prompt_as_one_option_value() -> None:
    prompt = "-fix 'it'\n now"
    spec = GROK.prepare(_setup(), prompt, executable="/opt/grok")
    assert spec.argv[0] == "/opt/grok" and spec.stdin is None
    assert spec.argv[-1] == f"--prompt={prompt}"
    assert spec.argv[spec.argv.index("--model") + 1] == "Qwen/Qwen3-8B"
    assert spec.argv[spec.argv.index("--max-tool-rounds") + 1] == str(MAX_TOOL_ROUNDS)
    # a flag would write the key or URL into ~/.grok/user-settings.json: both travel in the environment
    assert not {"--api-key", "-k", "--base-url", "-u"} & set(spec.argv)
    with pytest.raises(ValueError, match="no flag that appends"):
        GROK.prepare(_setup(HarnessOptions(system_prompt_suffix="hint")), "task")


def _lines(*messages: dict[str, Any]) -> str:
    return "".join(json.dumps(m) + "\n" for m in messages)


USER = {"role": "user", "content": "fix it"}
CALL = {"role": "assistant", "content": "Using tools to help you...",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}]}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "add.py"}


def test_parse_success_and_errors() -> None:
    ok = parse_grok_output(0, _lines(USER, CALL, RESULT, {"role": "assistant", "content": "Done."}), "")
    assert (ok.ok, ok.exit_code, ok.final_answer) == (True, 0, "Done.")
    assert ok.tool_calls == [{"id": "c1", "name": "bash", "input": {"command": "ls"}}]
    # a failed model call: exit 0, and the error is the last assistant message
    failed = parse_grok_output(0, _lines(USER, {"role": "assistant", "content":
                                                "Sorry, I encountered an error: Grok API error: 401 bad key"}), "")
    assert (failed.ok, failed.exit_code, failed.process_exit_code) == (False, 1, 0)
    assert failed.error == "Grok API error: 401 bad key" and failed.final_answer is None
    rounds = parse_grok_output(0, _lines(USER, CALL, RESULT, {"role": "assistant", "content":
                                         "Maximum tool execution rounds reached. Stopping to prevent infinite loops."}), "")
    assert not rounds.ok and "Maximum tool execution rounds" in (rounds.error or "")
    assert len(rounds.tool_calls) == 1
    crashed = parse_grok_output(1, "", "❌ Error: API key required. Set GROK_API_KEY environment variable\n")
    assert not crashed.ok and crashed.exit_code == 1 and "API key required" in (crashed.error or "")
    thrown = parse_grok_output(1, _lines({"role": "assistant", "content": "Error: boom"}), "")
    assert thrown.error == "Error: boom"
    assert parse_grok_output(0, "", "").error == "grok printed no assistant message"
    assert "did not exit" in (parse_grok_output(None, "", "").error or "")


# -- the real CLI -----------------------------------------------------------------------------------


@pytest.mark.cli
@pytest.mark.parametrize("prompt_mode", ["full_history", "incremental"])
def test_real_grok_cli_runs_a_tool_episode_offline(sandbox: LocalSandbox, recording_stack: tuple, run_connects: Any,
                                                   prompt_mode: str) -> None:
    engine, recorder, admin = recording_stack
    session = admin.create_session(harness="grok-cli", prompt_mode=prompt_mode)
    turns = [{"tool_calls": [{"name": "bash", "arguments": '{"command": "echo harness-proof > proof.txt"}'}]},
             {"content": "FINAL ANSWER: done"}]
    engine.set_script(session["session_id"], Script(turns=script_for(turns, "grok-cli")))
    endpoint = sandbox.model_endpoint(f"{recorder.url}/rollout/{session['session_id']}/v1", session["secret"])
    setup = HarnessSetup(endpoint=endpoint, model="policy", workdir=sandbox.workdir, home=sandbox.home,
                         max_output_tokens=1024)
    spec = GROK.prepare(setup, "Write the proof file, then report.")
    place_files(sandbox, spec)
    # the CLI loads the task directory's .env, which must neither turn Morph on nor move the base URL
    sandbox.write_file(".env", "MORPH_API_KEY=sk-morph\nGROK_BASE_URL=http://192.0.2.1/v1\n")
    command, connects = run_connects(sandbox, spec, 120)
    result = GROK.parse_output(command.exit_code, command.stdout, command.stderr)
    assert result.ok, (result.error, command.stdout[-2000:], command.stderr[-2000:])
    assert result.final_answer == "FINAL ANSWER: done"
    assert [c["name"] for c in result.tool_calls] == ["bash"]
    assert sandbox.read_file("proof.txt") == b"harness-proof\n"
    records = admin.records(session["session_id"])
    assert [r["metadata"]["dialect"] for r in records] == ["chat"] * 2
    assert [r["metadata"]["call_kind"] for r in records] == ["agent"] * 2
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact"]
    assert {r["request"]["model"] for r in records} == {"policy"}
    assert {r["request"]["max_tokens"] for r in records} == {1024}, "GROK_MAX_TOKENS reaches the request"
    assert records[1]["request"]["messages"][-2]["tool_calls"][0]["function"]["arguments"] == (
        '{"command": "echo harness-proof > proof.txt"}'), "the sampled argument text comes back verbatim"
    assert "edit_file" not in {t["function"]["name"] for t in records[0]["request"]["tools"]}, "no Morph tool"
    # its project settings, which it creates in the task's directory (the --model flag wins over them)
    assert json.loads(sandbox.read_file(".grok/settings.json")) == {"model": "grok-code-fast-1"}
    settings = json.loads(sandbox.read_file(f"{sandbox.home}/.grok/user-settings.json"))
    assert "apiKey" not in settings, "the key never lands in a file"
    if connects is not None:  # every connection the process tree made went to the recorder
        port = int(recorder.url.rsplit(":", 1)[1])
        assert connects and set(connects) == {("127.0.0.1", port)}, connects
