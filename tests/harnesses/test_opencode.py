"""The OpenCode preset: its files, command and output reading, then the real CLI through a sandbox."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from openenv_harness.harnesses import API_KEY_ENV, HarnessOptions, HarnessSetup, get_preset
from openenv_harness.harnesses.launch import place_files, run_once
from openenv_harness.harnesses.opencode import parse_opencode_output
from openenv_harness.sandbox import LocalSandbox, ModelEndpoint

OPENCODE = get_preset("opencode")
HOME = "/sbx/home"
CONFIG_DIR = f"{HOME}/.config/opencode"


def _setup(options: HarnessOptions | None = None, headers: dict[str, str] | None = None) -> HarnessSetup:
    endpoint = ModelEndpoint("http://127.0.0.1:9/rollout/s1/v1", "sk-never-in-files", dict(headers or {}))
    return HarnessSetup(
        endpoint=endpoint,
        model="Qwen/Qwen3-8B",
        workdir="/sbx/workdir",
        home=HOME,
        context_window=40960,
        max_output_tokens=2048,
        options=options or HarnessOptions(),
    )


def _config(setup: HarnessSetup) -> dict[str, Any]:
    return json.loads(OPENCODE.prepare(setup, "task").files[f"{CONFIG_DIR}/opencode.json"])


def test_files_configure_the_provider_and_stop_the_plugin_install() -> None:
    spec = OPENCODE.prepare(_setup(headers={"X-Rollout-Session": "s1"}), "task")
    assert set(spec.files) == {
        f"{CONFIG_DIR}/opencode.json",
        f"{CONFIG_DIR}/package.json",
        f"{CONFIG_DIR}/package-lock.json",
        f"{CONFIG_DIR}/node_modules/.keep",
    }
    assert all("sk-never-in-files" not in content for content in spec.files.values())
    plugin = "@opencode-ai/plugin"
    assert plugin in json.loads(spec.files[f"{CONFIG_DIR}/package.json"])["dependencies"]
    assert plugin in json.loads(spec.files[f"{CONFIG_DIR}/package-lock.json"])["packages"][""]["dependencies"]
    # The config is found through XDG_CONFIG_HOME, which the preset sets to the same place.
    assert spec.env["XDG_CONFIG_HOME"] == f"{HOME}/.config"

    provider = json.loads(spec.files[f"{CONFIG_DIR}/opencode.json"])["provider"]["rollout"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == "http://127.0.0.1:9/rollout/s1/v1"
    assert provider["options"]["apiKey"] == "{env:" + API_KEY_ENV + "}"
    assert provider["options"]["headers"] == {"X-Rollout-Session": "s1"}
    assert provider["options"]["headerTimeout"] == provider["options"]["chunkTimeout"] == 600000
    model = provider["models"]["Qwen/Qwen3-8B"]
    assert model["limit"] == {"context": 40960, "output": 2048}
    assert model["tool_call"] is True and model["reasoning"] is False


def test_training_defaults_and_opt_ins() -> None:
    config = _config(_setup())
    assert config["model"] == config["small_model"] == "rollout/Qwen/Qwen3-8B"
    assert config["agent"] == {"title": {"disable": True}}
    assert config["compaction"] == {"auto": False}
    assert config["tools"] == {"webfetch": False}
    assert (config["autoupdate"], config["share"], config["snapshot"]) == (False, "disabled", False)

    overrides = {"tools": {"task": False}}
    options = HarnessOptions(title_call=True, compaction=True, webfetch=True, config_overrides=overrides)
    opted = _config(_setup(options))
    assert opted["agent"] == {"title": {"disable": False}}
    assert opted["compaction"] == {"auto": True}
    assert opted["tools"] == {"task": False}


def test_environment_is_offline() -> None:
    env = OPENCODE.prepare(_setup(), "task").env
    for name in (
        "OPENCODE_DISABLE_AUTOUPDATE", "OPENCODE_DISABLE_SHARE", "OPENCODE_DISABLE_MODELS_FETCH",
        "OPENCODE_DISABLE_LSP_DOWNLOAD", "OPENCODE_DISABLE_DEFAULT_PLUGINS", "OPENCODE_DISABLE_CLAUDE_CODE",
        "OPENCODE_DISABLE_EXTERNAL_SKILLS", "OPENCODE_DISABLE_PROJECT_CONFIG",
    ):  # fmt: skip
        assert env[name] == "1", name
    assert env[API_KEY_ENV] == "sk-never-in-files"
    assert env["HOME"] == HOME


def test_prompt_goes_on_stdin_never_argv() -> None:
    prompt = 'Say "hi"\n  twice '
    spec = OPENCODE.prepare(_setup(HarnessOptions(extra_args=("--agent", "build"))), prompt, executable="/opt/oc")
    assert spec.stdin == prompt
    assert spec.argv == ["/opt/oc", "run", "--format", "json", "-m", "rollout/Qwen/Qwen3-8B", "--agent", "build"]


def _line(kind: str, **fields: Any) -> str:
    return json.dumps({"type": kind, "sessionID": "ses_1", **fields}) + "\n"


def test_parse_final_answer_tools_and_errors() -> None:
    state = {"status": "completed", "input": {"command": "ls"}}
    tool = {"type": "tool", "tool": "bash", "callID": "c1", "state": state}
    stdout = (
        _line("step_start", part={"type": "step-start"})
        + _line("text", part={"type": "text", "text": "thinking aloud"})
        + _line("tool_use", part=tool)
        + _line("step_finish", part={"reason": "tool-calls"})
        + _line("step_start", part={"type": "step-start"})
        + _line("text", part={"type": "text", "text": "All "})
        + _line("text", part={"type": "text", "text": "done."})
        + _line("step_finish", part={"reason": "stop"})
    )
    ok = parse_opencode_output(0, stdout, "")
    assert (ok.ok, ok.exit_code, ok.final_answer) == (True, 0, "All done.")
    assert ok.tool_calls == [{"id": "c1", "name": "bash", "input": {"command": "ls"}, "status": "completed"}]

    error = {"name": "APIError", "data": {"message": "invalid api key", "statusCode": 401, "isRetryable": False}}
    failed = parse_opencode_output(1, _line("error", error=error), "")
    assert (failed.ok, failed.exit_code, failed.error, failed.final_answer) == (False, 1, "401 invalid api key", None)
    hidden = parse_opencode_output(0, stdout + _line("error", error={"name": "UnknownError"}), "")
    assert not hidden.ok and hidden.exit_code == 1 and hidden.error == "UnknownError"
    plain = parse_opencode_output(1, "", "INFO something\nError: injected 400 from stub\n")
    assert plain.error == "Error: injected 400 from stub"
    killed = parse_opencode_output(None, stdout, "")
    assert not killed.ok and "did not exit" in (killed.error or "")


# -- the real CLI -----------------------------------------------------------------------------------

PROOF_COMMAND = "echo harness-proof > proof.txt && cat proof.txt"
#: Quotes, spaces, a newline, non-ASCII and surrounding whitespace: argv would have mangled it.
PROMPT = '  Write the "proof" file,\nthen report — exactly. '


def _setup_for(sandbox: LocalSandbox, url: str, key: str, options: HarnessOptions | None = None) -> HarnessSetup:
    endpoint = sandbox.model_endpoint(url, key)
    return HarnessSetup(
        endpoint=endpoint,
        model="Qwen/Qwen3-8B",
        workdir=sandbox.workdir,
        home=sandbox.home,
        options=options or HarnessOptions(),
    )


@pytest.mark.cli
def test_two_turn_tool_episode(sandbox: LocalSandbox, stub_engine: Callable[..., Any], run_traced: Any) -> None:
    engine = stub_engine(tool_command=PROOF_COMMAND, final_text="FINAL ANSWER: done", api_key="sk-oc-key")
    setup = _setup_for(sandbox, f"{engine.url}/rollout/sess-oc/v1", "sk-oc-key")
    spec = OPENCODE.prepare(setup, PROMPT)
    place_files(sandbox, spec)

    started = time.monotonic()
    command, outbound = run_traced(sandbox, spec, 90)
    result = OPENCODE.parse_output(command.exit_code, command.stdout, command.stderr)
    assert time.monotonic() - started < 60, "an offline run must not wait on the network"

    assert result.ok, (result.error, command.stderr[-2000:])
    assert (result.exit_code, result.final_answer) == (0, "FINAL ANSWER: done")
    assert [call["name"] for call in result.tool_calls] == ["bash"]
    assert sandbox.read_file("proof.txt") == b"harness-proof\n"  # the tool ran in the workdir

    requests = engine.chat_requests()
    assert len(requests) == 2, "the title call is off by default"
    session_ids = {r.headers.get("x-session-id") for r in requests}
    assert len(session_ids) == 1 and None not in session_ids
    for request in requests:
        assert request.path == "/rollout/sess-oc/v1/chat/completions"
        assert request.headers["authorization"] == "Bearer sk-oc-key"
        assert request.body["max_tokens"] == 4096
        assert "webfetch" not in {tool["function"]["name"] for tool in request.body["tools"]}
        assert not any(rule.matches(request.body) for rule in OPENCODE.aux_rules)
    first, second = (r.body for r in requests)
    users = [m for m in first["messages"] if m["role"] == "user"]
    assert [u["content"] for u in users] == [PROMPT]  # byte-exact through stdin
    assert "harness-proof" in str([m for m in second["messages"] if m["role"] == "tool"])

    # Nothing went to the npm registry: the seeded plugin markers held.
    assert not Path(sandbox.home, ".npm").exists()
    assert sorted(p.name for p in Path(sandbox.home, ".config", "opencode", "node_modules").iterdir()) == [".keep"]
    if outbound is not None:
        assert outbound == [], f"opencode tried to reach {outbound}"


@pytest.mark.cli
@pytest.mark.slow
def test_title_call_when_asked(sandbox: LocalSandbox, stub_engine: Callable[..., Any]) -> None:
    engine = stub_engine(tool_command=PROOF_COMMAND, final_text="FINAL ANSWER: done")
    setup = _setup_for(sandbox, f"{engine.url}/rollout/sess-title/v1", "k", HarnessOptions(title_call=True))
    run = run_once(OPENCODE, sandbox, setup, "Write the proof file.", timeout_s=90)
    assert run.result.ok, run.result.error
    matched = [[r.name for r in OPENCODE.aux_rules if r.matches(req.body)] for req in engine.chat_requests()]
    assert sorted(matched) == [[], [], ["opencode-title"]]


@pytest.mark.cli
def test_401_fails_promptly_and_visibly(sandbox: LocalSandbox, stub_engine: Callable[..., Any]) -> None:
    engine = stub_engine(tool_command=PROOF_COMMAND, final_text="never", api_key="sk-right")
    setup = _setup_for(sandbox, f"{engine.url}/rollout/sess-401/v1", "sk-wrong")
    started = time.monotonic()
    run = run_once(OPENCODE, sandbox, setup, "Do the task.", timeout_s=90)
    assert time.monotonic() - started < 30
    assert run.command.exit_code == 1
    assert not run.result.ok and run.result.exit_code == 1
    assert run.result.error == "401 invalid api key"
    assert len(engine.chat_requests()) == 1
