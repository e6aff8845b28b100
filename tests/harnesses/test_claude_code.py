"""The Claude Code preset: settings, environment, command and output reading, then the real CLI."""

from __future__ import annotations

import json
from typing import Any

import pytest

from openenv_harness.harnesses import API_KEY_ENV, HarnessOptions, HarnessSetup, get_preset
from openenv_harness.harnesses.claude_code import MODEL_VARIABLES, parse_claude_output
from openenv_harness.harnesses.launch import place_files
from openenv_harness.rollout.taskset import script_for
from openenv_harness.sandbox import LocalSandbox, ModelEndpoint
from openenv_harness.testing.engine import Script

CLAUDE = get_preset("claude-code")
HOME = "/sbx/home"
SETTINGS = f"{HOME}/.claude/settings.json"


def _setup(options: HarnessOptions | None = None, headers: dict[str, str] | None = None) -> HarnessSetup:
    endpoint = ModelEndpoint("http://127.0.0.1:9/rollout/s1/v1", "sk-never-in-files", dict(headers or {}))
    return HarnessSetup(endpoint=endpoint, model="Qwen/Qwen3-8B", workdir="/sbx/workdir", home=HOME,
                        context_window=40960, max_output_tokens=2048, options=options or HarnessOptions())


def test_settings_name_the_key_and_deny_web_tools() -> None:
    spec = CLAUDE.prepare(_setup(), "task")
    assert set(spec.files) == {SETTINGS} and "sk-never-in-files" not in spec.files[SETTINGS]
    settings = json.loads(spec.files[SETTINGS])
    assert settings["apiKeyHelper"] == f"printenv {API_KEY_ENV}" and spec.env[API_KEY_ENV] == "sk-never-in-files"
    assert settings["permissions"] == {"deny": ["WebFetch", "WebSearch"]}
    assert not any(v == "sk-never-in-files" for k, v in spec.env.items() if k != API_KEY_ENV)
    web = json.loads(CLAUDE.prepare(_setup(HarnessOptions(webfetch=True)), "task").files[SETTINGS])
    assert "permissions" not in web


def test_environment_pins_every_model_and_points_at_the_session() -> None:
    spec = CLAUDE.prepare(_setup(headers={"X-Rollout-Session": "s1"}), "task")
    env = spec.env
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9/rollout/s1"  # the SDK appends /v1/messages
    assert {name: env[name] for name in MODEL_VARIABLES} == {name: "Qwen/Qwen3-8B" for name in MODEL_VARIABLES}
    assert {"ANTHROPIC_DEFAULT_HAIKU_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL", "ANTHROPIC_SMALL_FAST_MODEL"} <= set(env)
    assert env["CLAUDE_CONFIG_DIR"] == f"{HOME}/.claude" and env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "2048"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and env["DISABLE_AUTOUPDATER"] == "1"
    assert env["DISABLE_COMPACT"] == "1" and env["CLAUDE_CODE_MAX_RETRIES"] == "0"
    assert env["ANTHROPIC_CUSTOM_HEADERS"] == "X-Rollout-Session: s1"
    on = CLAUDE.prepare(_setup(HarnessOptions(compaction=True, retries=True)), "task").env
    assert "DISABLE_COMPACT" not in on and on["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "40960"
    assert "CLAUDE_CODE_MAX_RETRIES" not in on


def test_command_puts_the_prompt_after_a_separator() -> None:
    prompt = "-fix 'it'\n now"
    spec = CLAUDE.prepare(_setup(), prompt, executable="/opt/claude")
    assert spec.argv[:4] == ["/opt/claude", "-p", "--output-format", "stream-json"] and spec.stdin is None
    assert spec.argv[-2:] == ["--", prompt] and "--dangerously-skip-permissions" in spec.argv
    assert spec.argv[spec.argv.index("--model") + 1] == "Qwen/Qwen3-8B"


def _events(*events: dict[str, Any]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


def test_parse_success_and_errors() -> None:
    use = {"type": "assistant", "message": {"content": [{"type": "tool_use", "id": "t1", "name": "Bash",
                                                          "input": {"command": "ls"}}]}}
    done = {"type": "result", "subtype": "success", "is_error": False, "result": "Done."}
    ok = parse_claude_output(0, _events({"type": "system", "subtype": "init"}, use, done), "")
    assert (ok.ok, ok.final_answer) == (True, "Done.")
    assert ok.tool_calls == [{"id": "t1", "name": "Bash", "input": {"command": "ls"}}]
    api = {"type": "result", "subtype": "success", "is_error": True, "api_error_status": 400,
           "result": "API Error: 400 budget exhausted"}
    failed = parse_claude_output(1, _events(api), "")
    assert (failed.ok, failed.exit_code) == (False, 1) and failed.error == "400 API Error: 400 budget exhausted"
    assert not parse_claude_output(0, _events({**done, "subtype": "error_max_turns"}), "").ok
    crashed = parse_claude_output(1, "", "Error: no\n")
    assert not crashed.ok and crashed.error == "Error: no"
    assert "did not exit" in (parse_claude_output(None, "", "").error or "")


# -- the real CLI -----------------------------------------------------------------------------------


@pytest.mark.cli
def test_real_claude_code_runs_a_tool_episode_offline(sandbox: LocalSandbox, recording_stack: tuple,
                                                      run_connects: Any) -> None:
    engine, recorder, admin = recording_stack
    session = admin.create_session(harness="claude-code")
    turns = [{"tool_calls": [{"name": "bash", "arguments": '{"command":"echo harness-proof > proof.txt"}'}]},
             {"content": "FINAL ANSWER: done"}]
    engine.set_script(session["session_id"], Script(turns=script_for(turns, "claude-code")))
    endpoint = sandbox.model_endpoint(f"{recorder.url}/rollout/{session['session_id']}/v1", session["secret"])
    setup = HarnessSetup(endpoint=endpoint, model="policy", workdir=sandbox.workdir, home=sandbox.home)
    spec = CLAUDE.prepare(setup, "Write the proof file, then report.")
    place_files(sandbox, spec)
    command, connects = run_connects(sandbox, spec, 120)
    result = CLAUDE.parse_output(command.exit_code, command.stdout, command.stderr)
    assert result.ok, (result.error, command.stdout[-2000:], command.stderr[-2000:])
    assert result.final_answer == "FINAL ANSWER: done" and [c["name"] for c in result.tool_calls] == ["Bash"]
    assert sandbox.read_file("proof.txt") == b"harness-proof\n"
    records = admin.records(session["session_id"])
    assert [r["metadata"]["dialect"] for r in records] == ["anthropic"] * 2
    assert [r["metadata"]["call_kind"] for r in records] == ["agent"] * 2
    assert all(r["request"]["max_tokens"] == setup.max_output_tokens for r in records)
    assert {e["body"]["model"] for e in engine.requests(session["session_id"])} == {"policy"}
    if connects is not None:  # every connection the process tree made went to the recorder
        port = int(recorder.url.rsplit(":", 1)[1])
        assert connects and set(connects) == {("127.0.0.1", port)}, connects
