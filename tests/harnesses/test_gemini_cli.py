"""The Gemini CLI preset: settings, environment, command and output reading, then the real CLI."""

from __future__ import annotations

import json
from typing import Any

import pytest

from openenv_harness.harnesses import API_KEY_ENV, HarnessOptions, HarnessSetup, get_preset
from openenv_harness.harnesses.gemini_cli import WEB_TOOLS, parse_gemini_output
from openenv_harness.harnesses.launch import place_files
from openenv_harness.rollout.taskset import script_for
from openenv_harness.sandbox import LocalSandbox, ModelEndpoint
from openenv_harness.testing.engine import Script

GEMINI = get_preset("gemini-cli")
HOME = "/sbx/home"
SETTINGS = f"{HOME}/.gemini/settings.json"


def _setup(options: HarnessOptions | None = None, headers: dict[str, str] | None = None) -> HarnessSetup:
    endpoint = ModelEndpoint("http://127.0.0.1:9/rollout/s1/v1", "sk-never-in-files", dict(headers or {}))
    return HarnessSetup(endpoint=endpoint, model="Qwen/Qwen3-8B", workdir="/sbx/workdir", home=HOME,
                        context_window=40960, max_output_tokens=2048, options=options or HarnessOptions())


def test_settings_stay_in_the_sandbox_home_and_keep_the_cli_offline() -> None:
    spec = GEMINI.prepare(_setup(), "task")
    assert set(spec.files) == {SETTINGS} and "sk-never-in-files" not in spec.files[SETTINGS]
    settings = json.loads(spec.files[SETTINGS])
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["privacy"]["usageStatisticsEnabled"] is False and settings["telemetry"]["enabled"] is False
    assert settings["general"]["enableAutoUpdate"] is False
    assert settings["model"]["skipNextSpeakerCheck"] is True and settings["model"]["disableLoopDetection"] is True
    assert settings["model"]["compressionThreshold"] > 1, "compaction off by default"
    assert settings["tools"]["exclude"] == list(WEB_TOOLS)
    web = json.loads(GEMINI.prepare(_setup(HarnessOptions(webfetch=True, compaction=True)), "task").files[SETTINGS])
    assert "tools" not in web and web["model"]["compressionThreshold"] < 1


def test_environment_points_at_the_session() -> None:
    env = GEMINI.prepare(_setup(headers={"X-Rollout-Session": "s1"}), "task").env
    assert env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:9/rollout/s1"  # the SDK appends /v1beta/models/...
    assert env["GEMINI_API_KEY"] == env[API_KEY_ENV] == "sk-never-in-files"
    assert env["GEMINI_MODEL"] == "Qwen/Qwen3-8B" and env["GEMINI_CLI_HOME"] == HOME and env["HOME"] == HOME
    assert env["GEMINI_CLI_CUSTOM_HEADERS"] == "X-Rollout-Session:s1"
    assert env["GEMINI_CLI_NO_RELAUNCH"] == "true"


def test_command_is_headless_and_carries_the_prompt_as_one_argument() -> None:
    prompt = "-fix 'it'\n now"
    spec = GEMINI.prepare(_setup(), prompt, executable="/opt/gemini")
    assert spec.argv[0] == "/opt/gemini" and spec.stdin is None
    assert spec.argv[-2:] == ["--prompt", prompt] and spec.argv[spec.argv.index("--approval-mode") + 1] == "yolo"
    assert spec.argv[spec.argv.index("--output-format") + 1] == "stream-json"
    assert spec.argv[spec.argv.index("--model") + 1] == "Qwen/Qwen3-8B"


def _events(*events: dict[str, Any]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


def test_parse_success_and_errors() -> None:
    use = {"type": "tool_use", "tool_name": "run_shell_command", "tool_id": "t1", "parameters": {"command": "ls"}}
    said = [{"type": "message", "role": "assistant", "content": "Do", "delta": True},
            {"type": "message", "role": "assistant", "content": "ne.", "delta": True}]
    done = {"type": "result", "status": "success", "stats": {}}
    ok = parse_gemini_output(0, _events({"type": "init"}, {"type": "message", "role": "user", "content": "x"},
                                        use, *said, done), "")
    assert (ok.ok, ok.final_answer) == (True, "Done.")
    assert ok.tool_calls == [{"id": "t1", "name": "run_shell_command", "input": {"command": "ls"}}]
    failed = parse_gemini_output(1, _events({"type": "result", "status": "error",
                                             "error": {"type": "Error", "message": "budget exhausted"}}), "")
    assert (failed.ok, failed.exit_code, failed.error) == (False, 1, "budget exhausted")
    assert not parse_gemini_output(0, _events({**done, "status": "error"}), "").ok
    crashed = parse_gemini_output(41, "", "Invalid auth method selected.\n")
    assert not crashed.ok and crashed.error == "Invalid auth method selected." and crashed.exit_code == 41
    assert "did not exit" in (parse_gemini_output(None, "", "").error or "")


# -- the real CLI -----------------------------------------------------------------------------------


@pytest.mark.cli
def test_real_gemini_cli_runs_a_tool_episode_offline(sandbox: LocalSandbox, recording_stack: tuple,
                                                     run_connects: Any) -> None:
    engine, recorder, admin = recording_stack
    # incremental: the compact argument text sampled here is re-rendered spaced by the template
    # (``tool_args_roundtrip`` false), a restyle full history would record as replay_drift
    session = admin.create_session(harness="gemini-cli", prompt_mode="incremental")
    turns = [{"tool_calls": [{"name": "bash", "arguments": '{"command":"echo harness-proof > proof.txt"}'}]},
             {"content": "FINAL ANSWER: done"}]
    engine.set_script(session["session_id"], Script(turns=script_for(turns, "gemini-cli")))
    endpoint = sandbox.model_endpoint(f"{recorder.url}/rollout/{session['session_id']}/v1", session["secret"])
    setup = HarnessSetup(endpoint=endpoint, model="policy", workdir=sandbox.workdir, home=sandbox.home)
    spec = GEMINI.prepare(setup, "Write the proof file, then report.")
    place_files(sandbox, spec)
    command, connects = run_connects(sandbox, spec, 120)
    result = GEMINI.parse_output(command.exit_code, command.stdout, command.stderr)
    assert result.ok, (result.error, command.stdout[-2000:], command.stderr[-2000:])
    assert "FINAL ANSWER: done" in (result.final_answer or "")
    assert [c["name"] for c in result.tool_calls] == ["run_shell_command"]
    assert sandbox.read_file("proof.txt") == b"harness-proof\n"
    records = admin.records(session["session_id"])
    assert [r["metadata"]["dialect"] for r in records] == ["gemini"] * 2
    assert [r["metadata"]["call_kind"] for r in records] == ["agent"] * 2
    assert [r["metadata"]["stream"] for r in records] == [True] * 2
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact"]
    assert records[1]["request"]["messages"][-2]["tool_calls"][0]["function"]["arguments"] == (
        '{"command":"echo harness-proof > proof.txt"}'), "the sampled text, though replayed as an object"
    assert {r["request"]["model"] for r in records} == {"policy"}
    if connects is not None:  # every connection the process tree made went to the recorder
        port = int(recorder.url.rsplit(":", 1)[1])
        assert connects and set(connects) == {("127.0.0.1", port)}, connects
