"""The Cline CLI preset: settings, environment, command and output reading, then the real CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from openenv_harness.harnesses import API_KEY_ENV, HarnessOptions, HarnessSetup, get_preset
from openenv_harness.harnesses.cline import SUBAGENT_TOOLS, WEB_TOOLS, parse_cline_output
from openenv_harness.harnesses.launch import place_files
from openenv_harness.rollout.taskset import script_for
from openenv_harness.sandbox import LocalSandbox, ModelEndpoint
from openenv_harness.testing.engine import Script

CLINE = get_preset("cline")
HOME = "/sbx/home"
PROVIDERS = f"{HOME}/.cline/data/settings/providers.json"
GLOBAL = f"{HOME}/.cline/data/settings/global-settings.json"


def _setup(options: HarnessOptions | None = None, headers: dict[str, str] | None = None) -> HarnessSetup:
    endpoint = ModelEndpoint("http://127.0.0.1:9/rollout/s1/v1", "sk-never-in-files", dict(headers or {}))
    return HarnessSetup(endpoint=endpoint, model="Qwen/Qwen3-8B", workdir="/sbx/workdir", home=HOME,
                        context_window=40960, max_output_tokens=2048, options=options or HarnessOptions())


def test_settings_stay_in_the_sandbox_home_and_keep_the_cli_offline() -> None:
    spec = CLINE.prepare(_setup(headers={"X-Rollout-Session": "s1"}), "task")
    assert set(spec.files) == {PROVIDERS, GLOBAL}
    assert not any("sk-never-in-files" in text for text in spec.files.values())
    providers = json.loads(spec.files[PROVIDERS])
    assert providers["lastUsedProvider"] == "openai-compatible"
    settings = providers["providers"]["openai-compatible"]["settings"]
    assert settings["baseUrl"] == "http://127.0.0.1:9/rollout/s1/v1" and settings["model"] == "Qwen/Qwen3-8B"
    assert settings["contextWindow"] == 40960 and settings["timeout"] == 600_000 and "apiKey" not in settings
    assert settings["headers"] == {"X-Rollout-Session": "s1"}
    behaviour = json.loads(spec.files[GLOBAL])
    assert behaviour["telemetryOptOut"] is True and behaviour["autoUpdateEnabled"] is False
    assert behaviour["compactionEnabled"] is False
    assert set(behaviour["disabledTools"]) == {*SUBAGENT_TOOLS, *WEB_TOOLS}
    assert behaviour["tools"] == {"web_search": {"enabled": False}}
    web = json.loads(CLINE.prepare(_setup(HarnessOptions(webfetch=True, compaction=True)), "task").files[GLOBAL])
    assert set(web["disabledTools"]) == set(SUBAGENT_TOOLS) and web["tools"]["web_search"]["enabled"] is True
    assert web["compactionEnabled"] is True
    assert CLINE.prepare(_setup(), "other task").config_hashes() == CLINE.prepare(_setup(), "task").config_hashes()


def test_environment_points_at_the_session() -> None:
    env = CLINE.prepare(_setup(), "task").env
    assert env["OPENAI_API_KEY"] == env[API_KEY_ENV] == "sk-never-in-files"
    assert env["CLINE_DIR"] == f"{HOME}/.cline" and env["CLINE_DATA_DIR"] == f"{HOME}/.cline/data"
    assert env["HOME"] == HOME
    assert env["CLINE_SESSION_BACKEND_MODE"] == "local"  # no detached hub daemon
    assert env["IS_TEST"] == "true" and env["CLINE_NO_AUTO_UPDATE"] == "1"


def test_command_is_headless_and_carries_the_prompt_as_one_argument() -> None:
    prompt = "-fix 'it'\n now"
    spec = CLINE.prepare(_setup(), prompt, executable="/opt/cline")
    assert spec.argv[0] == "/opt/cline" and spec.stdin is None
    assert spec.argv[-2:] == ["--", prompt] and "--json" in spec.argv and "--yolo" not in spec.argv
    assert spec.argv[spec.argv.index("--auto-approve") + 1] == "true"
    assert spec.argv[spec.argv.index("-P") + 1] == "openai-compatible"
    assert spec.argv[spec.argv.index("-m") + 1] == "Qwen/Qwen3-8B"
    assert spec.argv[spec.argv.index("--compaction") + 1] == "off"
    # a prompt without whitespace gets a trailing space: Cline refuses it as a mistyped command otherwise
    assert CLINE.prepare(_setup(), "hi").argv[-2:] == ["--", "hi "]
    compacting = CLINE.prepare(_setup(HarnessOptions(compaction=True, extra_args=("-v",))), "do it").argv
    assert compacting[compacting.index("--compaction") + 1] == "agentic" and compacting[-3:] == ["-v", "--", "do it"]
    with pytest.raises(ValueError, match="no flag that appends"):
        CLINE.prepare(_setup(HarnessOptions(system_prompt_suffix="be brief")), "t")
    # --system replaces the whole system prompt: the request's system message is exactly this text
    replaced = CLINE.prepare(_setup(HarnessOptions(system_prompt="You are terse.")), "do it").argv
    assert replaced[1:3] == ["--system", "You are terse."] and replaced[-2:] == ["--", "do it"]


def test_compaction_rule_marks_only_the_summary_call() -> None:
    [rule] = CLINE.aux_rules
    summary = {"messages": [
        {"role": "system", "content": "Summarize the provided coding session into a concise continuation note "
                                      "with detailed next steps."},
        {"role": "user", "content": "..."}]}
    assert rule.matches(summary)
    agent = {"messages": [{"role": "system", "content": "You are Cline, an AI coding agent."}],
             "tools": [{"type": "function", "function": {"name": "run_commands"}}]}
    assert not rule.matches(agent) and not rule.matches({**summary, "tools": agent["tools"]})


def _events(*events: dict[str, Any]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


def _tool_start(name: str, call_id: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "agent_event", "event": {"type": "content_start", "contentType": "tool", "toolName": name,
                                             "toolCallId": call_id, "input": arguments}}


def test_parse_success_and_errors() -> None:
    use = _tool_start("run_commands", "call_1", {"commands": "ls"})
    said = {"type": "agent_event", "event": {"type": "content_start", "contentType": "text", "text": "Done."}}
    done = {"type": "run_result", "finishReason": "completed", "iterations": 2, "text": "Done."}
    ok = parse_cline_output(0, _events({"type": "hook_event", "hookEventName": "agent_start"}, use, said, done), "")
    assert (ok.ok, ok.exit_code, ok.final_answer) == (True, 0, "Done.")
    assert ok.tool_calls == [{"id": "call_1", "name": "run_commands", "input": {"commands": "ls"}}]
    failed = parse_cline_output(1, _events({**done, "finishReason": "error", "text": "401 Unauthorized"},
                                           {"type": "error", "message": "401 Unauthorized"}), "")
    assert (failed.ok, failed.exit_code, failed.error) == (False, 1, "401 Unauthorized")
    aborted = parse_cline_output(0, _events({**done, "finishReason": "aborted", "text": ""}), "")
    assert not aborted.ok and aborted.exit_code == 1 and aborted.error == "finishReason=aborted"
    crashed = parse_cline_output(2, "", "error: unknown option '--nope'\n")
    assert not crashed.ok and crashed.error == "error: unknown option '--nope'" and crashed.exit_code == 2
    assert "did not exit" in (parse_cline_output(None, "", "").error or "")


# -- the real CLI -----------------------------------------------------------------------------------


@pytest.fixture
def cline_sandbox(tmp_path: Path) -> Iterator[LocalSandbox]:
    """A fresh local sandbox whose PATH starts with the installed Cline CLI (installs only Cline)."""
    from openenv_harness.harnesses.install import default_node_prefix, ensure_installed

    ensure_installed(["cline"])
    with LocalSandbox(node_prefix=default_node_prefix(), parent_dir=tmp_path) as box:
        yield box


@pytest.mark.cli
@pytest.mark.parametrize("prompt_mode", ["full_history", "incremental"])
def test_real_cline_runs_a_tool_episode_offline(cline_sandbox: LocalSandbox, recording_stack: tuple,
                                                run_connects: Any, prompt_mode: str) -> None:
    sandbox = cline_sandbox
    engine, recorder, admin = recording_stack
    session = admin.create_session(harness="cline", prompt_mode=prompt_mode)
    # full history: object arguments, sampled as the template writes them (Cline replays them compact,
    # the engine re-renders its parse); incremental: the compact text itself, whatever the template does
    arguments: Any = ({"command": "echo harness-proof > proof.txt"} if prompt_mode == "full_history"
                      else '{"command":"echo harness-proof > proof.txt"}')
    turns = [{"tool_calls": [{"name": "bash", "arguments": arguments}]}, {"content": "FINAL ANSWER: done"}]
    engine.set_script(session["session_id"], Script(turns=script_for(turns, "cline")))
    endpoint = sandbox.model_endpoint(f"{recorder.url}/rollout/{session['session_id']}/v1", session["secret"])
    setup = HarnessSetup(endpoint=endpoint, model="policy", workdir=sandbox.workdir, home=sandbox.home)
    # one word in one mode: past Cline's check for a mistyped command, and sent exactly
    prompt = "Write the proof file, then report." if prompt_mode == "full_history" else "Proceed."
    spec = CLINE.prepare(setup, prompt)
    place_files(sandbox, spec)
    command, connects = run_connects(sandbox, spec, 120)
    result = CLINE.parse_output(command.exit_code, command.stdout, command.stderr)
    assert result.ok, (result.error, command.stdout[-2000:], command.stderr[-2000:])
    assert result.final_answer == "FINAL ANSWER: done"
    assert [(c["name"], c["input"]) for c in result.tool_calls] == [
        ("run_commands", {"commands": "echo harness-proof > proof.txt"})]
    assert sandbox.read_file("proof.txt") == b"harness-proof\n"
    records = admin.records(session["session_id"])
    assert [r["metadata"]["dialect"] for r in records] == ["chat"] * 2
    assert [r["metadata"]["call_kind"] for r in records] == ["agent"] * 2
    assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact"]
    assert {r["request"]["model"] for r in records} == {"policy"}
    assert records[0]["request"]["messages"][1] == {"role": "user", "content": prompt}
    tools = {t["function"]["name"] for t in records[0]["request"]["tools"]}
    assert "run_commands" in tools and not tools & {*WEB_TOOLS, *SUBAGENT_TOOLS}
    replayed = json.loads(records[1]["request"]["messages"][-2]["tool_calls"][0]["function"]["arguments"])
    assert replayed == {"commands": "echo harness-proof > proof.txt"}
    settings = Path(sandbox.home) / ".cline" / "data" / "settings"
    assert session["secret"] not in "".join(p.read_text() for p in settings.iterdir() if p.is_file())
    if connects is not None:  # every connection the process tree made went to the recorder
        port = int(recorder.url.rsplit(":", 1)[1])
        assert connects and set(connects) == {("127.0.0.1", port)}, connects
