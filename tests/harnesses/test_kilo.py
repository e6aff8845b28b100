"""The Kilo Code CLI preset: config, environment, command and output reading, then the real CLI."""

from __future__ import annotations

import json
from typing import Any

import pytest

from openenv_harness.harnesses import API_KEY_ENV, HarnessOptions, HarnessSetup, get_preset
from openenv_harness.harnesses.kilo import COMPACTION_MARKER, SCHEMA, TITLE_MARKER, parse_kilo_output
from openenv_harness.harnesses.launch import place_files
from openenv_harness.rollout.taskset import script_for
from openenv_harness.sandbox import LocalSandbox, ModelEndpoint
from openenv_harness.testing.engine import Script

KILO = get_preset("kilo")
HOME = "/sbx/home"
CONFIG = f"{HOME}/.config/kilo/kilo.json"


def _setup(options: HarnessOptions | None = None, headers: dict[str, str] | None = None) -> HarnessSetup:
    endpoint = ModelEndpoint("http://127.0.0.1:9/rollout/s1/v1", "sk-never-in-files", dict(headers or {}))
    return HarnessSetup(endpoint=endpoint, model="Qwen/Qwen3-8B", workdir="/sbx/workdir", home=HOME,
                        context_window=40960, max_output_tokens=2048, options=options or HarnessOptions())


def _config(setup: HarnessSetup) -> dict[str, Any]:
    return json.loads(KILO.prepare(setup, "task").files[CONFIG])


def test_config_stays_in_the_sandbox_home_and_names_only_the_recorder() -> None:
    spec = KILO.prepare(_setup(headers={"X-Rollout-Session": "s1"}), "task")
    assert set(spec.files) == {CONFIG} and "sk-never-in-files" not in spec.files[CONFIG]
    config = _config(_setup(headers={"X-Rollout-Session": "s1"}))
    assert config["$schema"] == SCHEMA, "without it Kilo rewrites the file at start"
    provider = config["provider"]["rollout"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == "http://127.0.0.1:9/rollout/s1/v1"
    assert provider["options"]["apiKey"] == "{env:" + API_KEY_ENV + "}"
    assert provider["options"]["headers"] == {"X-Rollout-Session": "s1"}
    assert provider["models"]["Qwen/Qwen3-8B"]["limit"] == {"context": 40960, "output": 2048}
    assert config["enabled_providers"] == ["rollout"], "the Kilo Gateway provider is never loaded"
    assert config["model"] == config["small_model"] == "rollout/Qwen/Qwen3-8B"
    assert config["autoupdate"] is False and config["share"] == "disabled" and config["snapshot"] is False
    assert config["experimental"]["openTelemetry"] is False
    assert config["permission"] == {"bash": "allow"}, "else Kilo's bash-permission migration rewrites the file"


def test_training_defaults_and_opt_ins() -> None:
    config = _config(_setup())
    assert config["agent"]["title"]["disable"] is True
    assert config["compaction"] == {"auto": False, "prune": False}
    assert config["tools"] == {"webfetch": False}
    opted = _config(_setup(HarnessOptions(title_call=True, compaction=True, webfetch=True,
                                          config_overrides={"compaction": {"reserved": 1000}})))
    assert opted["agent"]["title"]["disable"] is False and "tools" not in opted
    assert opted["compaction"] == {"auto": True, "prune": True, "reserved": 1000}


def test_environment_is_offline_and_points_at_the_session() -> None:
    env = KILO.prepare(_setup(), "task").env
    assert env[API_KEY_ENV] == "sk-never-in-files"
    assert env["HOME"] == HOME and env["XDG_CONFIG_HOME"] == f"{HOME}/.config"
    for name in ("KILO_DISABLE_AUTOUPDATE", "KILO_DISABLE_SHARE", "KILO_DISABLE_SESSION_INGEST",
                 "KILO_DISABLE_MODELS_FETCH", "KILO_DISABLE_LSP_DOWNLOAD", "KILO_DISABLE_DEFAULT_PLUGINS",
                 "KILO_NO_DAEMON", "KILO_DISABLE_PRESENCE"):
        assert env[name] == "1", name
    assert env["KILO_TELEMETRY_LEVEL"] == "off"
    assert env["KILO_SESSION_RETRY_LIMIT"] == "1", "a gone recorder must not be retried without end"
    assert KILO.prepare(_setup(HarnessOptions(retries=True)), "task").env["KILO_SESSION_RETRY_LIMIT"] == "5"


def test_command_is_headless_with_the_prompt_on_stdin() -> None:
    prompt = '  Write the "proof" file,\nthen report. '
    spec = KILO.prepare(_setup(HarnessOptions(extra_args=("--print-logs",))), prompt, executable="/opt/kilo")
    assert spec.argv == ["/opt/kilo", "run", "--format", "json", "--auto", "-m", "rollout/Qwen/Qwen3-8B",
                         "--print-logs"]
    assert spec.stdin == prompt and prompt not in spec.argv
    with pytest.raises(ValueError, match="no flag that appends"):
        KILO.prepare(_setup(HarnessOptions(system_prompt_suffix="be brief")), "task")


def _line(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, "sessionID": "ses_1", **fields}) + "\n"


def test_parse_success_and_errors() -> None:
    tool = {"type": "tool", "callID": "call_1", "tool": "bash",
            "state": {"status": "completed", "input": {"command": "ls"}, "output": "a\n"}}
    stdout = (_line("step_start", part={"type": "step-start"}) + _line("text", part={"type": "text", "text": "Looking."})
              + _line("tool_use", part=tool) + _line("step_finish", part={"reason": "tool-calls"})
              + _line("step_start", part={"type": "step-start"}) + _line("text", part={"type": "text", "text": "Done."})
              + _line("step_finish", part={"reason": "stop"}))
    ok = parse_kilo_output(0, stdout, "")
    assert (ok.ok, ok.exit_code, ok.final_answer) == (True, 0, "Done.")
    assert ok.tool_calls == [{"id": "call_1", "name": "bash", "input": {"command": "ls"}, "status": "completed"}]
    error = {"name": "APIError", "data": {"message": "invalid api key", "statusCode": 401, "isRetryable": False}}
    failed = parse_kilo_output(1, _line("error", error=error), "\x1b[91mError: \x1b[0minvalid api key\n")
    assert (failed.ok, failed.exit_code, failed.error) == (False, 1, "401 invalid api key")
    offline = {"name": "APIError", "data": {"message": "Cannot connect to API", "isRetryable": True}}
    assert parse_kilo_output(1, _line("error", error=offline), "").error == "Cannot connect to API"
    assert not parse_kilo_output(0, stdout + _line("error", error=error), "").ok, "an error event fails an exit 0"
    crashed = parse_kilo_output(2, "", "boom\n")
    assert (crashed.ok, crashed.exit_code, crashed.error) == (False, 2, "boom")
    assert parse_kilo_output(None, "", "").error == "kilo did not exit (killed or timed out)"


def test_aux_rules_match_kilos_hidden_agents_only() -> None:
    title, compaction = KILO.aux_rules
    persona = "You are Kilo, a highly skilled software engineer.\n\n# Personality\n...\n"

    def body(system: str, tools: bool = False) -> dict[str, Any]:
        return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "bash"}}] if tools else []}

    assert title.matches(body(persona + TITLE_MARKER + "\n\n<task>"))
    assert compaction.matches(body(persona + COMPACTION_MARKER + " You are given a conversation"))
    assert not title.matches(body(persona)) and not compaction.matches(body(persona)), "another tool-less call"
    assert not compaction.matches(body(persona + COMPACTION_MARKER, tools=True))


# -- the real CLI -----------------------------------------------------------------------------------


@pytest.mark.cli
@pytest.mark.parametrize("prompt_mode", ["full_history", "incremental"])
def test_real_kilo_runs_a_tool_episode_offline(sandbox: LocalSandbox, recording_stack: tuple, run_connects: Any,
                                               prompt_mode: str) -> None:
    engine, recorder, admin = recording_stack
    session = admin.create_session(harness="kilo", prompt_mode=prompt_mode)
    turns = [{"tool_calls": [{"name": "bash", "arguments": '{"command": "echo harness-proof > proof.txt"}'}]},
             {"content": "FINAL ANSWER: done"}]
    engine.set_script(session["session_id"], Script(turns=script_for(turns, "kilo")))
    endpoint = sandbox.model_endpoint(f"{recorder.url}/rollout/{session['session_id']}/v1", session["secret"])
    setup = HarnessSetup(endpoint=endpoint, model="policy", workdir=sandbox.workdir, home=sandbox.home)
    spec = KILO.prepare(setup, "Write the proof file, then report.")
    place_files(sandbox, spec)
    command, connects = run_connects(sandbox, spec, 180)
    result = KILO.parse_output(command.exit_code, command.stdout, command.stderr)
    assert result.ok, (result.error, command.stdout[-2000:], command.stderr[-2000:])
    assert result.final_answer == "FINAL ANSWER: done"
    assert [c["name"] for c in result.tool_calls] == ["bash"]
    assert sandbox.read_file("proof.txt") == b"harness-proof\n"
    [config_path] = spec.files
    assert sandbox.read_file(config_path).decode() == spec.files[config_path], "Kilo left its config as placed"
    records = admin.records(session["session_id"])
    assert [r["metadata"]["dialect"] for r in records] == ["chat"] * 2
    assert [r["metadata"]["call_kind"] for r in records] == ["agent"] * 2, "no title call by default"
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact"]
    chain = records[0]["prompt_token_ids"] + records[0]["completion_token_ids"]
    assert records[1]["prompt_token_ids"][:len(chain)] == chain, "the second prompt extends the first call"
    assert {r["request"]["model"] for r in records} == {"policy"}
    first = records[0]["request"]["messages"]
    assert first[0]["role"] == "system" and first[0]["content"].startswith("You are Kilo")
    assert "webfetch" not in {t["function"]["name"] for t in records[0]["request"]["tools"]}
    if connects is not None:  # every connection the process tree made went to the recorder
        port = int(recorder.url.rsplit(":", 1)[1])
        assert connects and set(connects) == {("127.0.0.1", port)}, connects


@pytest.mark.cli
@pytest.mark.slow
def test_compaction_when_asked_is_recorded_as_aux(sandbox: LocalSandbox, recording_stack: tuple) -> None:
    engine, recorder, admin = recording_stack
    # the preset's rules, as a rollout gives them (``rollout/launch.py``)
    rules = [rule.as_flat() for rule in KILO.aux_rules] + [{"name": "no-tools", "no_tools": True}]
    session = admin.create_session(harness="kilo", aux_rules=rules)
    turns = [{"tool_calls": [{"name": "bash", "arguments": '{"command": "echo harness-proof > proof.txt"}'}]},
             {"content": "FINAL ANSWER: done"}]
    engine.set_script(session["session_id"], Script(turns=script_for(turns, "kilo")))
    endpoint = sandbox.model_endpoint(f"{recorder.url}/rollout/{session['session_id']}/v1", session["secret"])
    # Kilo's first prompt is ~17.7k tokens on this engine, above 19000 - 2048: it compacts after its first call
    setup = HarnessSetup(endpoint=endpoint, model="policy", workdir=sandbox.workdir, home=sandbox.home,
                         context_window=19000, max_output_tokens=2048, options=HarnessOptions(compaction=True))
    spec = KILO.prepare(setup, "Write the proof file, then report.")
    place_files(sandbox, spec)
    command = sandbox.run(spec.argv, env=spec.env, cwd=spec.cwd, stdin=spec.stdin, timeout_s=180)
    result = KILO.parse_output(command.exit_code, command.stdout, command.stderr)
    # Its own prompt and tools alone exceed the window, so each compaction leaves it as full as before,
    # and Kilo gives up after three (the scripted engine answers the continued chain with turn 0 again).
    assert not result.ok and "Compaction exhausted" in (result.error or ""), result.error
    records = admin.records(session["session_id"])
    kinds = [r["metadata"]["call_kind"] for r in records]
    assert kinds[:3] == ["agent", "aux", "agent"], kinds
    aux = [r for r in records if r["metadata"]["call_kind"] == "aux"]
    assert {r["metadata"]["aux_rule"] for r in aux} == {"kilo-compaction"}
    assert all(r["request"]["messages"][0]["content"].startswith("You are Kilo") for r in aux), "persona first"
    agents = [r for r in records if r["metadata"]["call_kind"] == "agent"]
    assert [r["metadata"]["fidelity"]["class"] for r in agents] == ["root"] + ["break"] * (len(agents) - 1)


@pytest.mark.cli
@pytest.mark.slow
def test_a_gone_recorder_ends_the_run_instead_of_waiting_for_it(sandbox: LocalSandbox) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    endpoint = sandbox.model_endpoint(f"http://127.0.0.1:{port}/rollout/gone/v1", "k")
    setup = HarnessSetup(endpoint=endpoint, model="policy", workdir=sandbox.workdir, home=sandbox.home)
    spec = KILO.prepare(setup, "Do the task.")
    place_files(sandbox, spec)
    # without KILO_SESSION_RETRY_LIMIT Kilo calls this "offline" and retries every ~5 s without end
    command = sandbox.run(spec.argv, env=spec.env, cwd=spec.cwd, stdin=spec.stdin, timeout_s=150)
    result = KILO.parse_output(command.exit_code, command.stdout, command.stderr)
    assert command.exit_code == 1 and not result.ok
    assert "Cannot connect to API" in (result.error or ""), result.error
