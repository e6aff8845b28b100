"""The Pi preset (``@mariozechner/pi-coding-agent``).

Pi reads its provider from ``$PI_CODING_AGENT_DIR/models.json`` and its behaviour from
``settings.json`` next to it. It runs one task headless with ``-p --no-session`` and the prompt as
one positional argument (stdin stays empty: piped stdin is trimmed and prepended to the prompt).

Why ``--mode json`` and not text mode: text mode exits 1 on a model error, which looks simpler, but
it prints nothing but the final text, and a stream that carried no SSE at all ends silently with exit
0 and an empty answer. JSON mode always exits 0 -- even on a 401 -- yet its ``agent_end`` event holds
the whole conversation: the last assistant message's ``stopReason`` (``error``/``aborted``) and
``errorMessage`` make a failure explicit, and the tool executions are visible too. ``parse_pi_output``
turns that into a real exit code.

Pi makes no outbound connection in ``-p`` mode; ``PI_OFFLINE`` and friends keep it that way if its
defaults change. The ``compat`` block keeps its requests within what vLLM accepts (no ``store``, no
``developer`` role, ``max_tokens`` rather than ``max_completion_tokens``).
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from openenv_harness.harnesses.base import (
    API_KEY_ENV,
    PROVIDER_ID,
    AuxCondition,
    AuxRule,
    HarnessPreset,
    HarnessResult,
    HarnessSetup,
    deep_merge,
    last_stderr_line,
    parse_jsonl,
)


def agent_dir(setup: HarnessSetup) -> str:
    return posixpath.join(setup.home, ".pi", "agent")


def _models_json(setup: HarnessSetup) -> dict[str, Any]:
    provider: dict[str, Any] = {
        "baseUrl": setup.base_url,
        "api": "openai-completions",
        # Pi resolves a value that names an environment variable to that variable's value.
        "apiKey": API_KEY_ENV,
        "compat": {"supportsDeveloperRole": False, "supportsStore": False, "maxTokensField": "max_tokens"},
        "models": [
            {
                "id": setup.model,
                "name": setup.model,
                "reasoning": setup.options.reasoning,
                "input": ["text"],
                "contextWindow": setup.context_window,
                "maxTokens": setup.max_output_tokens,
                "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
            }
        ],
    }
    if setup.endpoint.extra_headers:
        provider["headers"] = dict(setup.endpoint.extra_headers)
    return {"providers": {PROVIDER_ID: provider}}


def _settings_json(setup: HarnessSetup) -> dict[str, Any]:
    options = setup.options
    timeout_ms = int(options.request_timeout_s * 1000)
    retries = bool(options.retries)  # None (decided by the sandbox, ``launch.py``) is off when unresolved
    retry: dict[str, Any] = {"enabled": retries, "provider": {"timeoutMs": timeout_ms}}
    if not retries:
        # The agent-level switch alone leaves the SDK's own retries (3 attempts) in place.
        retry["provider"]["maxRetries"] = 0
    settings: dict[str, Any] = {
        "defaultProvider": PROVIDER_ID,
        "defaultModel": setup.model,
        "quietStartup": True,
        "enableInstallTelemetry": False,
        "compaction": {"enabled": options.compaction},
        "retry": retry,
    }
    return deep_merge(settings, options.config_overrides)


def pi_files(setup: HarnessSetup) -> dict[str, str]:
    root = agent_dir(setup)
    return {
        posixpath.join(root, "models.json"): json.dumps(_models_json(setup), indent=2) + "\n",
        posixpath.join(root, "settings.json"): json.dumps(_settings_json(setup), indent=2) + "\n",
    }


def pi_env(setup: HarnessSetup) -> dict[str, str]:
    return {"PI_CODING_AGENT_DIR": agent_dir(setup)}


def pi_command(setup: HarnessSetup, prompt: str, executable: str) -> tuple[list[str], str | None]:
    argv = [
        executable,
        "-p",
        "--mode",
        "json",
        "--no-session",
        # Extensions, skills and prompt templates found in the task's directory would run code or
        # change the prompt behind the trainer's back.
        "--no-extensions",
        "--no-skills",
        "--no-prompt-templates",
        "--provider",
        PROVIDER_ID,
        "--model",
        setup.model,
        *setup.options.extra_args,
    ]
    if not prompt.startswith(("-", "@")):
        return [*argv, prompt], None
    # Pi's argument parser reads "-..." as a flag and "@..." as a file to attach, so such a prompt
    # goes on stdin, which Pi trims: exact only when there is no surrounding whitespace.
    if prompt != prompt.strip():
        raise ValueError("pi: a prompt starting with '-' or '@' cannot carry leading or trailing whitespace")
    return argv, prompt


def _last_assistant(messages: list[Any]) -> dict[str, Any] | None:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "assistant":
            return message
    return None


def _text_of(message: dict[str, Any]) -> str:
    parts = message.get("content") or []
    if isinstance(parts, str):
        return parts
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict) and p.get("type") == "text")


def _failure(exit_code: int | None, error: str, tool_calls: list[dict[str, Any]]) -> HarnessResult:
    return HarnessResult(
        ok=False,
        exit_code=exit_code if exit_code else 1,
        process_exit_code=exit_code,
        final_answer=None,
        error=error,
        tool_calls=tool_calls,
    )


def parse_pi_output(exit_code: int | None, stdout: str, stderr: str) -> HarnessResult:
    """Exit status and final answer of ``pi -p --mode json``; errors come from ``agent_end``."""
    events = parse_jsonl(stdout)
    tool_calls = [
        {"id": e.get("toolCallId"), "name": e.get("toolName"), "input": e.get("args")}
        for e in events
        if e.get("type") == "tool_execution_start"
    ]
    if exit_code is None:
        return _failure(None, "pi did not exit (killed or timed out)", tool_calls)
    if exit_code != 0:
        return _failure(exit_code, last_stderr_line(stderr) or f"pi exited with status {exit_code}", tool_calls)
    ends = [e for e in events if e.get("type") == "agent_end"]
    if not ends:
        return _failure(exit_code, last_stderr_line(stderr) or "pi printed no agent_end event", tool_calls)
    last = _last_assistant(ends[-1].get("messages") or [])
    if last is None:
        return _failure(exit_code, "pi ended without an assistant reply", tool_calls)
    if last.get("stopReason") in ("error", "aborted"):
        reason = last.get("errorMessage") or f"stopReason={last.get('stopReason')}"
        return _failure(exit_code, str(reason), tool_calls)
    return HarnessResult(
        ok=True, exit_code=0, process_exit_code=exit_code, final_answer=_text_of(last), tool_calls=tool_calls
    )


PI = HarnessPreset(
    name="pi",
    append_system_prompt_flag="--append-system-prompt",
    system_prompt_flag="--system-prompt",
    npm_package="@mariozechner/pi-coding-agent",
    version="0.73.1",
    bin_name="pi",
    binary="node_modules/.bin/pi",
    aux_rules=(
        AuxRule(
            name="pi-compaction",
            when=AuxCondition(no_tools=True, system_prompt_startswith="You are a context summarization assistant"),
        ),
    ),
    offline_env={"PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"},
    files=pi_files,
    env=pi_env,
    command=pi_command,
    parse=parse_pi_output,
    # dist/cli.js starts with "#!/usr/bin/env node".
    requires=("node",),
)
