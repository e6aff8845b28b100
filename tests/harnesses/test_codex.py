"""The Codex preset: its config, command and output reading, then the real CLI through the recorder."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest

from openenv_harness.harnesses import API_KEY_ENV, HarnessOptions, HarnessSetup, get_preset
from openenv_harness.harnesses.codex import parse_codex_output, to_toml
from openenv_harness.harnesses.launch import place_files
from openenv_harness.rollout.taskset import script_for
from openenv_harness.sandbox import LocalSandbox, ModelEndpoint
from openenv_harness.testing.engine import Script

CODEX = get_preset("codex")
HOME = "/sbx/home"
CONFIG = f"{HOME}/.codex/config.toml"


def _setup(options: HarnessOptions | None = None, headers: dict[str, str] | None = None) -> HarnessSetup:
    endpoint = ModelEndpoint("http://127.0.0.1:9/rollout/s1/v1", "sk-never-in-files", dict(headers or {}))
    return HarnessSetup(endpoint=endpoint, model="Qwen/Qwen3-8B", workdir="/sbx/workdir", home=HOME,
                        context_window=40960, max_output_tokens=2048, options=options or HarnessOptions())


def _config(setup: HarnessSetup) -> dict[str, Any]:
    spec = CODEX.prepare(setup, "task")
    assert set(spec.files) == {CONFIG}
    return tomllib.loads(spec.files[CONFIG])


def test_config_points_at_the_recorder_over_the_responses_api_without_the_key() -> None:
    setup = _setup(headers={"X-Rollout-Session": "s1"})
    spec = CODEX.prepare(setup, "task")
    assert "sk-never-in-files" not in spec.files[CONFIG] and spec.env[API_KEY_ENV] == "sk-never-in-files"
    config = _config(setup)
    assert (config["model"], config["model_provider"], config["model_context_window"]) == ("Qwen/Qwen3-8B", "rollout",
                                                                                             40960)
    provider = config["model_providers"]["rollout"]
    assert provider["base_url"] == "http://127.0.0.1:9/rollout/s1/v1" and provider["wire_api"] == "responses"
    assert provider["env_key"] == API_KEY_ENV and provider["http_headers"] == {"X-Rollout-Session": "s1"}
    assert provider["request_max_retries"] == 0 and provider["stream_max_retries"] == 0
    assert spec.env["CODEX_HOME"] == f"{HOME}/.codex" and spec.env["HOME"] == HOME


def test_config_keeps_it_offline_and_on_the_policys_tools() -> None:
    config = _config(_setup())
    assert config["check_for_update_on_startup"] is False and config["analytics"] == {"enabled": False}
    assert config["web_search"] == "disabled" and config["agents"] == {"enabled": False}
    assert not any(config["features"].values()) and {"plugins", "shell_snapshot", "apps"} <= set(config["features"])
    assert config["model_auto_compact_token_limit"] > 10**8  # compaction off
    on = _config(_setup(HarnessOptions(compaction=True, retries=True, webfetch=True,
                                       config_overrides={"features": {"plugins": True}})))
    assert on["model_auto_compact_token_limit"] == int(40960 * 0.9) and on["web_search"] == "live"
    assert "request_max_retries" not in on["model_providers"]["rollout"] and on["features"]["plugins"] is True


def test_toml_writer_round_trips() -> None:
    data = {"a": 1, "b": "q\"uote\n", "c": [1, "x"], "d": True, "t": {"k": 2.5, "odd key": "v", "n": {"z": False}}}
    assert tomllib.loads(to_toml(data)) == data
    with pytest.raises(TypeError):
        to_toml({"x": None})


def test_command_puts_the_prompt_after_a_separator() -> None:
    prompt = "-fix 'it'\n now"
    spec = CODEX.prepare(_setup(HarnessOptions(extra_args=("--oss",))), prompt, executable="/opt/codex")
    assert spec.argv[:3] == ["/opt/codex", "exec", "--json"] and spec.stdin is None
    assert spec.argv[-2:] == ["--", prompt] and "--ephemeral" in spec.argv and "--oss" in spec.argv
    assert spec.argv[spec.argv.index("-m") + 1] == "Qwen/Qwen3-8B"


def _events(*events: dict[str, Any]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


def test_parse_success_and_errors() -> None:
    warning = {"type": "item.completed", "item": {"id": "i0", "type": "error", "message": "Model metadata not found"}}
    command = {"type": "item.completed", "item": {"id": "i1", "type": "command_execution", "command": "ls",
                                                  "status": "completed", "exit_code": 0}}
    answer = {"type": "item.completed", "item": {"id": "i2", "type": "agent_message", "text": "Done."}}
    ok = parse_codex_output(0, _events({"type": "thread.started"}, warning, command, answer, {"type": "turn.completed"}),
                            "")
    assert (ok.ok, ok.final_answer) == (True, "Done.")  # an error *item* is a warning, not a failure
    assert ok.tool_calls == [{"id": "i1", "name": "exec_command", "input": "ls", "status": "completed", "exit_code": 0}]
    failed = parse_codex_output(1, _events({"type": "turn.failed", "error": {"message": "400 budget exhausted"}}), "")
    assert (failed.ok, failed.exit_code, failed.error) == (False, 1, "400 budget exhausted")
    failed0 = parse_codex_output(0, _events({"type": "error", "message": "stream disconnected"}), "")
    assert not failed0.ok and failed0.exit_code == 1 and failed0.error == "stream disconnected"
    assert not parse_codex_output(0, _events({"type": "turn.completed"}), "").ok  # no answer
    assert "did not exit" in (parse_codex_output(None, "", "").error or "")


# -- the real CLI -----------------------------------------------------------------------------------


@pytest.mark.cli
def test_real_codex_runs_a_tool_episode_offline(sandbox: LocalSandbox, recording_stack: tuple, run_connects: Any) -> None:
    engine, recorder, admin = recording_stack
    session = admin.create_session(harness="codex")
    turns = [{"tool_calls": [{"name": "bash", "arguments": '{"command":"echo harness-proof > proof.txt"}'}]},
             {"content": "FINAL ANSWER: done"}]
    engine.set_script(session["session_id"], Script(turns=script_for(turns, "codex")))
    endpoint = sandbox.model_endpoint(f"{recorder.url}/rollout/{session['session_id']}/v1", session["secret"])
    setup = HarnessSetup(endpoint=endpoint, model="policy", workdir=sandbox.workdir, home=sandbox.home)
    spec = CODEX.prepare(setup, "Write the proof file, then report.")
    place_files(sandbox, spec)
    command, connects = run_connects(sandbox, spec, 120)
    result = CODEX.parse_output(command.exit_code, command.stdout, command.stderr)
    assert result.ok, (result.error, command.stderr[-2000:])
    assert result.final_answer == "FINAL ANSWER: done" and len(result.tool_calls) == 1
    assert sandbox.read_file("proof.txt") == b"harness-proof\n"
    records = admin.records(session["session_id"])
    assert [r["metadata"]["dialect"] for r in records] == ["responses"] * 2
    assert [r["metadata"]["call_kind"] for r in records] == ["agent"] * 2
    if connects is not None:  # every connection the process tree made went to the recorder
        port = int(recorder.url.rsplit(":", 1)[1])
        assert connects and set(connects) == {("127.0.0.1", port)}, connects
