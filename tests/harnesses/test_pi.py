"""The Pi preset: its files, command and output reading, then the real CLI through a sandbox."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from openenv_harness.harnesses import API_KEY_ENV, HarnessOptions, HarnessSetup, get_preset
from openenv_harness.harnesses.launch import place_files, run_once
from openenv_harness.harnesses.pi import parse_pi_output
from openenv_harness.sandbox import LocalSandbox, ModelEndpoint

PI = get_preset("pi")
HOME = "/sbx/home"
AGENT_DIR = f"{HOME}/.pi/agent"


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


def _files(setup: HarnessSetup) -> tuple[dict[str, Any], dict[str, Any]]:
    files = PI.prepare(setup, "task").files
    assert set(files) == {f"{AGENT_DIR}/models.json", f"{AGENT_DIR}/settings.json"}
    return json.loads(files[f"{AGENT_DIR}/models.json"]), json.loads(files[f"{AGENT_DIR}/settings.json"])


def test_models_json_points_at_the_endpoint_without_the_key() -> None:
    setup = _setup(headers={"X-Rollout-Session": "s1"})
    spec = PI.prepare(setup, "task")
    assert all("sk-never-in-files" not in content for content in spec.files.values())
    models, _ = _files(setup)
    provider = models["providers"]["rollout"]
    assert provider["baseUrl"] == "http://127.0.0.1:9/rollout/s1/v1"
    assert provider["api"] == "openai-completions"
    assert provider["apiKey"] == API_KEY_ENV
    assert provider["headers"] == {"X-Rollout-Session": "s1"}
    compat = {"supportsDeveloperRole": False, "supportsStore": False, "maxTokensField": "max_tokens"}
    assert provider["compat"] == compat
    [model] = provider["models"]
    assert (model["id"], model["contextWindow"], model["maxTokens"]) == ("Qwen/Qwen3-8B", 40960, 2048)
    assert model["reasoning"] is False


def test_settings_disable_compaction_and_retries_by_default() -> None:
    _, settings = _files(_setup())
    assert settings["defaultProvider"] == "rollout" and settings["defaultModel"] == "Qwen/Qwen3-8B"
    assert settings["compaction"] == {"enabled": False}
    assert settings["retry"] == {"enabled": False, "provider": {"timeoutMs": 600000, "maxRetries": 0}}
    assert settings["enableInstallTelemetry"] is False


def test_options_opt_back_in() -> None:
    options = HarnessOptions(
        compaction=True,
        retries=True,
        reasoning=True,
        request_timeout_s=30,
        config_overrides={"compaction": {"keepRecentTokens": 5}},
    )
    models, settings = _files(_setup(options))
    assert settings["compaction"] == {"enabled": True, "keepRecentTokens": 5}
    assert settings["retry"] == {"enabled": True, "provider": {"timeoutMs": 30000}}
    assert models["providers"]["rollout"]["models"][0]["reasoning"] is True


def test_environment_is_offline_and_private() -> None:
    spec = PI.prepare(_setup(HarnessOptions(extra_env={"PI_OFFLINE": "yes", "EXTRA": "1"})), "task")
    assert spec.env["PI_CODING_AGENT_DIR"] == AGENT_DIR
    assert spec.env[API_KEY_ENV] == "sk-never-in-files"
    assert spec.env["HOME"] == HOME and spec.env["XDG_CONFIG_HOME"] == f"{HOME}/.config"
    assert spec.env["PI_SKIP_VERSION_CHECK"] == "1" and spec.env["PI_TELEMETRY"] == "0"
    assert spec.env["PI_OFFLINE"] == "yes" and spec.env["EXTRA"] == "1"  # the caller's extra_env wins
    assert spec.cwd == "/sbx/workdir"


def test_command_takes_the_prompt_as_one_argument() -> None:
    prompt = 'Fix "it"\n  now '
    spec = PI.prepare(_setup(HarnessOptions(extra_args=("--tools", "read,bash"))), prompt, executable="/opt/pi")
    assert spec.argv[0] == "/opt/pi"
    assert spec.argv[-1] == prompt and spec.stdin is None
    assert spec.argv[1:5] == ["-p", "--mode", "json", "--no-session"]
    assert spec.argv[spec.argv.index("--model") + 1] == "Qwen/Qwen3-8B"
    assert spec.argv[-3:-1] == ["--tools", "read,bash"]
    # Pi would read these as a flag and as a file to attach: they go on stdin instead.
    for prompt in ("--help me", "@README.md summarize"):
        spec = PI.prepare(_setup(), prompt)
        assert spec.stdin == prompt and prompt not in spec.argv
    with pytest.raises(ValueError, match="whitespace"):
        PI.prepare(_setup(), "-x \n")
    with pytest.raises(ValueError, match="non-empty"):
        PI.prepare(_setup(), "")


def _events(*events: dict[str, Any]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


_USER = {"role": "user", "content": [{"type": "text", "text": "task"}]}
_TOOL = {"type": "tool_execution_start", "toolCallId": "c1", "toolName": "bash", "args": {"command": "ls"}}


def test_parse_success_and_errors() -> None:
    parts = [{"type": "text", "text": "Done "}, {"type": "text", "text": "here."}]
    final = {"role": "assistant", "content": parts, "stopReason": "stop"}
    ok = parse_pi_output(0, _events({"type": "session"}, _TOOL, {"type": "agent_end", "messages": [_USER, final]}), "")
    assert (ok.ok, ok.exit_code, ok.final_answer) == (True, 0, "Done here.")
    assert ok.tool_calls == [{"id": "c1", "name": "bash", "input": {"command": "ls"}}]

    error = {"role": "assistant", "content": [], "stopReason": "error", "errorMessage": "401 invalid api key"}
    failed = parse_pi_output(0, _events({"type": "agent_end", "messages": [_USER, error]}), "")
    assert (failed.ok, failed.exit_code, failed.process_exit_code) == (False, 1, 0)
    assert failed.error == "401 invalid api key" and failed.final_answer is None

    truncated = parse_pi_output(0, _events({"type": "session"}, {"type": "agent_start"}), "")
    assert not truncated.ok and "agent_end" in (truncated.error or "")
    crashed = parse_pi_output(2, "", "warning\nError: boom\n")
    assert (crashed.ok, crashed.exit_code, crashed.error) == (False, 2, "Error: boom")
    killed = parse_pi_output(None, "", "")
    assert not killed.ok and killed.exit_code == 1 and "did not exit" in (killed.error or "")
    no_reply = parse_pi_output(0, _events({"type": "agent_end", "messages": [_USER]}), "")
    assert not no_reply.ok


# -- the real CLI -----------------------------------------------------------------------------------

PROOF_COMMAND = "echo harness-proof > proof.txt && cat proof.txt"


@pytest.mark.cli
def test_two_turn_tool_episode(sandbox: LocalSandbox, stub_engine: Callable[..., Any], run_traced: Any) -> None:
    engine = stub_engine(tool_command=PROOF_COMMAND, final_text="FINAL ANSWER: done", api_key="sk-pi-key")
    endpoint = sandbox.model_endpoint(f"{engine.url}/rollout/sess-pi/v1", "sk-pi-key")
    setup = HarnessSetup(endpoint=endpoint, model="Qwen/Qwen3-8B", workdir=sandbox.workdir, home=sandbox.home)
    prompt = "Write the proof file, then report."
    spec = PI.prepare(setup, prompt)
    hashes = place_files(sandbox, spec)
    assert set(hashes) == set(spec.files) and all(len(h) == 64 for h in hashes.values())

    started = time.monotonic()
    command, outbound = run_traced(sandbox, spec, 60)
    result = PI.parse_output(command.exit_code, command.stdout, command.stderr)
    assert time.monotonic() - started < 30, "an offline run must not wait on the network"

    assert result.ok, (result.error, command.stderr[-2000:])
    assert (result.exit_code, result.final_answer) == (0, "FINAL ANSWER: done")
    assert [call["name"] for call in result.tool_calls] == ["bash"]
    assert sandbox.read_file("proof.txt") == b"harness-proof\n"  # the tool ran in the workdir

    requests = engine.chat_requests()
    assert len(requests) == 2
    for request in requests:
        assert request.path == "/rollout/sess-pi/v1/chat/completions"
        assert request.headers["authorization"] == "Bearer sk-pi-key"
        assert request.body["model"] == "Qwen/Qwen3-8B"
        assert request.body["max_tokens"] == 4096 and "store" not in request.body
    first, second = (r.body for r in requests)
    assert first["messages"][1]["content"] == [{"type": "text", "text": prompt}]
    tool_messages = [m for m in second["messages"] if m["role"] == "tool"]
    assert tool_messages and "harness-proof" in str(tool_messages[0]["content"])

    assert spec.env["PI_OFFLINE"] == "1"
    if outbound is not None:
        assert outbound == [], f"pi tried to reach {outbound}"


@pytest.mark.cli
def test_close_kills_what_the_agent_left_running(sandbox: LocalSandbox, stub_engine: Callable[..., Any]) -> None:
    """Pi runs its shell tool in a new session; a server the model started there must still die."""
    leftover = "(sleep 300 & echo $! > leftover.pid) > /dev/null 2>&1"
    engine = stub_engine(tool_command=leftover, final_text="started")
    setup = HarnessSetup(
        endpoint=sandbox.model_endpoint(f"{engine.url}/v1", "k"), model="m", workdir=sandbox.workdir, home=sandbox.home
    )
    run = run_once(PI, sandbox, setup, "Start a server.", timeout_s=60)
    assert run.result.ok, run.result.error
    leftover_pid = int(sandbox.read_file("leftover.pid"))
    assert Path(f"/proc/{leftover_pid}").exists()
    sandbox.close()
    stat = Path(f"/proc/{leftover_pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", "close() left a tool process"


@pytest.mark.cli
def test_401_fails_promptly_and_visibly(sandbox: LocalSandbox, stub_engine: Callable[..., Any]) -> None:
    engine = stub_engine(tool_command=PROOF_COMMAND, final_text="never", api_key="sk-right")
    endpoint = sandbox.model_endpoint(f"{engine.url}/rollout/sess-401/v1", "sk-wrong")
    setup = HarnessSetup(endpoint=endpoint, model="stub-model", workdir=sandbox.workdir, home=sandbox.home)
    started = time.monotonic()
    run = run_once(PI, sandbox, setup, "Do the task.", timeout_s=60)
    assert time.monotonic() - started < 15
    assert run.command.exit_code == 0  # Pi's JSON mode exits 0 even here ...
    assert not run.result.ok and run.result.exit_code == 1  # ... the preset reads the failure anyway
    assert "401" in (run.result.error or "")
    assert len(engine.chat_requests()) == 1  # retries are off

