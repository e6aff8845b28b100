"""The Qwen Code preset: settings, environment, command, output reading and the scripted solutions'
sed rewrite, then the real CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from openenv_harness.harnesses import API_KEY_ENV, HarnessOptions, HarnessSetup, get_preset
from openenv_harness.harnesses.install import default_node_prefix, ensure_installed
from openenv_harness.harnesses.launch import place_files
from openenv_harness.harnesses.qwen_code import COMPRESSION_MARKER, WEB_TOOLS, parse_qwen_output
from openenv_harness.rollout.taskset import BUILTIN_TASKS, builtin_task_scripts, reference_model_name, script_for
from openenv_harness.sandbox import LocalSandbox, ModelEndpoint
from openenv_harness.testing.engine import Script

QWEN = get_preset("qwen-code")
HOME = "/sbx/home"
SETTINGS = f"{HOME}/.qwen/settings.json"


@pytest.fixture(scope="session")
def node_prefix() -> Path:
    """The node prefix with Qwen Code installed (only the CLI this module runs)."""
    ensure_installed(["qwen-code"])
    return default_node_prefix()


def _setup(options: HarnessOptions | None = None, headers: dict[str, str] | None = None) -> HarnessSetup:
    endpoint = ModelEndpoint("http://127.0.0.1:9/rollout/s1/v1", "sk-never-in-files", dict(headers or {}))
    return HarnessSetup(endpoint=endpoint, model="Qwen/Qwen3-8B", workdir="/sbx/workdir", home=HOME,
                        context_window=40960, max_output_tokens=2048, options=options or HarnessOptions())


def test_settings_stay_in_the_sandbox_home_and_keep_the_cli_offline() -> None:
    spec = QWEN.prepare(_setup(headers={"X-Rollout-Session": "s1"}), "task")
    assert set(spec.files) == {SETTINGS} and "sk-never-in-files" not in spec.files[SETTINGS]
    settings = json.loads(spec.files[SETTINGS])
    assert settings["security"]["auth"]["selectedType"] == "openai"
    [provider] = settings["modelProviders"]["openai"]
    assert provider["id"] == settings["model"]["name"] == "Qwen/Qwen3-8B"
    assert provider["baseUrl"] == "http://127.0.0.1:9/rollout/s1/v1"  # the SDK appends /chat/completions
    assert provider["envKey"] == API_KEY_ENV, "the file names the key's variable, never the key"
    generation = provider["generationConfig"]
    assert generation["contextWindowSize"] == 40960 and generation["samplingParams"] == {"max_tokens": 2048}
    assert generation["customHeaders"] == {"X-Rollout-Session": "s1"} and generation["maxRetries"] == 0
    assert generation["enableCacheControl"] is False, "compaction stays on its tool-less summarizer"
    assert settings["privacy"]["usageStatisticsEnabled"] is False and settings["telemetry"]["enabled"] is False
    assert settings["general"]["enableAutoUpdate"] is False
    assert settings["model"]["skipNextSpeakerCheck"] is True and settings["model"]["skipLoopDetection"] is True
    assert not any(settings["memory"].values()), "no background memory agents"
    assert settings["experimental"]["emitToolUseSummaries"] is False
    assert settings["tools"]["exclude"] == list(WEB_TOOLS)
    assert settings["context"]["autoCompactThreshold"] == 1, "compaction pushed to its ceiling by default"
    assert set(settings["context"]["clearContextOnIdle"].values()) == {-1}, "no clearing of old tool results"
    web = json.loads(QWEN.prepare(_setup(HarnessOptions(webfetch=True, compaction=True)), "task").files[SETTINGS])
    assert "tools" not in web and web["context"] == {}


def test_environment_points_at_the_session() -> None:
    env = QWEN.prepare(_setup(), "task").env
    assert env[API_KEY_ENV] == "sk-never-in-files" and env["HOME"] == HOME
    assert env["QWEN_HOME"] == f"{HOME}/.qwen"
    assert not any(k.startswith("OPENAI_") for k in env), "the settings select the provider, not OPENAI_*"


def test_command_is_headless_and_carries_the_prompt_as_one_argument() -> None:
    prompt = "-fix 'it'\n now"
    spec = QWEN.prepare(_setup(), prompt, executable="/opt/qwen")
    assert spec.argv[0] == "/opt/qwen" and spec.stdin is None
    assert spec.argv[-2:] == ["--prompt", prompt] and spec.argv[spec.argv.index("--approval-mode") + 1] == "yolo"
    assert spec.argv[spec.argv.index("--output-format") + 1] == "stream-json"
    assert spec.argv[spec.argv.index("--model") + 1] == "Qwen/Qwen3-8B"
    hinted = QWEN.prepare(_setup(HarnessOptions(system_prompt_suffix="Call tools as JSON.")), "task")
    assert hinted.argv[1:3] == ["--append-system-prompt", "Call tools as JSON."]


def _events(*events: dict[str, Any]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


def test_parse_success_and_errors() -> None:
    use = {"type": "assistant", "message": {"role": "assistant", "content": [
        {"type": "tool_use", "id": "t1", "name": "run_shell_command", "input": {"command": "ls"}}]}}
    said = {"type": "assistant", "message": {"role": "assistant", "content": [{"type": "text", "text": "Done."}]}}
    done = {"type": "result", "subtype": "success", "is_error": False, "result": "Done."}
    ok = parse_qwen_output(0, _events({"type": "system", "subtype": "init"}, use, said, done), "")
    assert (ok.ok, ok.exit_code, ok.final_answer) == (True, 0, "Done.")
    assert ok.tool_calls == [{"id": "t1", "name": "run_shell_command", "input": {"command": "ls"}}]
    failed = parse_qwen_output(1, _events({"type": "result", "subtype": "error_during_execution", "is_error": True,
                                           "error": {"message": "[API Error: 401 invalid API key]"}}), "")
    assert (failed.ok, failed.exit_code, failed.error) == (False, 1, "[API Error: 401 invalid API key]")
    assert not parse_qwen_output(0, _events({**done, "is_error": True}), "").ok
    crashed = parse_qwen_output(41, "", "Missing API key for openai auth.\n")
    assert not crashed.ok and crashed.error == "Missing API key for openai auth." and crashed.exit_code == 41
    assert "did not exit" in (parse_qwen_output(None, "", "").error or "")


def test_compression_rule_marks_only_the_summary_call() -> None:
    [rule] = QWEN.aux_rules
    history = [{"role": "user", "content": "fix it"}, {"role": "assistant", "content": "ok"}]
    summary = {"messages": [{"role": "system", "content": f"{COMPRESSION_MARKER}. The summary you produce..."},
                            *history, {"role": "user", "content": "Then, produce the <state_snapshot> XML."}]}
    agent_call = {"messages": [{"role": "system", "content": "You are Qwen Code, a non-interactive CLI agent"},
                               *history], "tools": [{"type": "function", "function": {"name": "run_shell_command"}}]}
    assert rule.matches(summary) and not rule.matches(agent_call)


def test_scripted_in_place_edits_are_written_for_its_shell() -> None:
    # Qwen Code runs a bare `sed -i EXPR FILE` as its own edit, which refuses a file its read_file
    # tool has not read: the scripted sed carries `--`, which its shell runs as written
    turns = BUILTIN_TASKS["fix-add"].reference_script
    mine = script_for(turns, "qwen-code")
    assert [c["arguments"]["command"] for t in mine for c in t.get("tool_calls", [])] == [
        "cat calc.py test_calc.py", "sed -i -- 's/return a - b/return a + b/' calc.py", "python3 -m unittest -q"]
    assert {c["name"] for t in mine for c in t.get("tool_calls", [])} == {"run_shell_command"}
    # the other agents' scripts are as before, and each spelling has a model name of its own
    gemini = script_for(turns, "gemini-cli")
    assert gemini[1]["tool_calls"][0]["arguments"]["command"] == "sed -i 's/return a - b/return a + b/' calc.py"
    assert script_for(turns, "pi") == [dict(t) for t in turns]
    assert reference_model_name("fix-add", "qwen-code") == "reference/fix-add/qwen-code"
    assert reference_model_name("fix-add", "gemini-cli") == "reference/fix-add/run_shell_command"
    scripts = builtin_task_scripts([BUILTIN_TASKS["fix-add"]])
    assert scripts["reference/fix-add/run_shell_command"] == gemini and scripts["reference/fix-add/qwen-code"] == mine
    # sampled text: only the command's characters change, the rest stays as the model wrote it
    text = '{"command" : "sed -i \'s/\\"a\\"/b/\' f.py", "timeout":5}'
    [turn] = script_for([{"tool_calls": [{"name": "bash", "arguments": text}]}], "qwen-code")
    assert turn["tool_calls"][0]["arguments"] == '{"command" : "sed -i -- \'s/\\"a\\"/b/\' f.py", "timeout":5}'
    assert json.loads(turn["tool_calls"][0]["arguments"])["command"] == "sed -i -- 's/\"a\"/b/' f.py"


# -- the real CLI -----------------------------------------------------------------------------------


@pytest.mark.cli
def test_real_qwen_code_runs_a_tool_episode_offline(sandbox: LocalSandbox, recording_stack: tuple,
                                                    run_connects: Any) -> None:
    engine, recorder, admin = recording_stack
    session = admin.create_session(harness="qwen-code", aux_rules=[r.as_flat() for r in QWEN.aux_rules])
    turns = [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo harness-proof > proof.txt"}}]},
             {"content": "FINAL ANSWER: done"}]
    engine.set_script(session["session_id"], Script(turns=script_for(turns, "qwen-code")))
    endpoint = sandbox.model_endpoint(f"{recorder.url}/rollout/{session['session_id']}/v1", session["secret"])
    setup = HarnessSetup(endpoint=endpoint, model="policy", workdir=sandbox.workdir, home=sandbox.home)
    spec = QWEN.prepare(setup, "Write the proof file, then report.")
    place_files(sandbox, spec)
    command, connects = run_connects(sandbox, spec, 180)
    result = QWEN.parse_output(command.exit_code, command.stdout, command.stderr)
    assert result.ok, (result.error, command.stdout[-2000:], command.stderr[-2000:])
    assert result.final_answer == "FINAL ANSWER: done"
    assert [c["name"] for c in result.tool_calls] == ["run_shell_command"]
    assert sandbox.read_file("proof.txt") == b"harness-proof\n"
    records = admin.records(session["session_id"])
    assert [r["metadata"]["dialect"] for r in records] == ["chat"] * 2
    assert [r["metadata"]["call_kind"] for r in records] == ["agent"] * 2
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact"]
    assert {r["request"]["model"] for r in records} == {"policy"}
    assert all(r["request"]["max_tokens"] <= setup.max_output_tokens for r in records)
    if connects is not None:  # every connection the process tree made went to the recorder
        port = int(recorder.url.rsplit(":", 1)[1])
        assert connects and set(connects) == {("127.0.0.1", port)}, connects
