"""The Claude Code preset (``@anthropic-ai/claude-code``), which speaks only the Anthropic Messages API.

Claude Code is pointed at the recorder with ``ANTHROPIC_BASE_URL = <recorder>/rollout/<session>``
(its SDK appends ``/v1/messages``). The key is never written: ``settings.json`` names a helper
command, ``printenv OPENENV_HARNESS_API_KEY``, whose output Claude Code sends as both ``x-api-key``
and a Bearer token. Every model it may pick -- the main model, the haiku/sonnet/opus/fable classes
behind its aliases, the small fast model, sub-agents -- is pinned to the policy model, so no call
(title generation, background calls) goes to a model the trainer did not serve. One task runs
headless with ``claude -p --output-format stream-json --verbose`` and the prompt after ``--``.

Offline (checked with strace: no connection but the recorder's): with
``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`` it skips its ``HEAD /api/hello`` probe, telemetry, error
reporting, feature flags and the autoupdater; ``WebFetch``/``WebSearch`` are denied in settings.
``IS_SANDBOX=1`` lets ``--dangerously-skip-permissions`` run as root (the rollout's sandbox is the
sandbox). ``CLAUDE_CODE_MAX_OUTPUT_TOKENS`` keeps ``max_tokens`` inside the engine's context.

Output: stream-json lines (``system``/``init``, ``assistant`` messages with their ``tool_use`` blocks,
``user`` tool results, and a final ``result`` with ``is_error``, ``subtype`` and the answer).

Replay (what the recorder sees next turn): ``tool_use.input`` comes back as a parsed JSON object
(the recorder restores the sampled text, ``recorder/dialects/memory.py``); thinking blocks come
back with their signatures; a mid-conversation ``system`` message carrying the environment is
sent as text blocks the first time and as a plain string afterwards (same text).
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from openenv_harness.harnesses.base import (
    API_KEY_ENV,
    AuxCondition,
    AuxRule,
    HarnessPreset,
    HarnessResult,
    HarnessSetup,
    deep_merge,
    last_stderr_line,
    parse_jsonl,
)

#: Environment variables naming a model Claude Code may call; all pinned to the policy model.
MODEL_VARIABLES = (
    "ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
    "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_FABLE_MODEL", "ANTHROPIC_SMALL_FAST_MODEL",
    "CLAUDE_CODE_SUBAGENT_MODEL", "CLAUDE_CODE_WORKFLOW_SUBAGENT_MODEL", "CLAUDE_CODE_AUTO_MODE_MODEL",
)


def config_dir(setup: HarnessSetup) -> str:
    return posixpath.join(setup.home, ".claude")


def anthropic_base_url(setup: HarnessSetup) -> str:
    """The recorder's session base without ``/v1``: the Anthropic SDK adds ``/v1/messages`` itself."""
    base = setup.base_url
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _settings(setup: HarnessSetup) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "apiKeyHelper": f"printenv {API_KEY_ENV}",
        "skipDangerousModePermissionPrompt": True,
        "includeCoAuthoredBy": False,
    }
    if not setup.options.webfetch:
        settings["permissions"] = {"deny": ["WebFetch", "WebSearch"]}
    return deep_merge(settings, setup.options.config_overrides)


def claude_files(setup: HarnessSetup) -> dict[str, str]:
    return {posixpath.join(config_dir(setup), "settings.json"): json.dumps(_settings(setup), indent=2) + "\n"}


def claude_env(setup: HarnessSetup) -> dict[str, str]:
    options = setup.options
    env = {name: setup.model for name in MODEL_VARIABLES}
    env.update({
        "CLAUDE_CONFIG_DIR": config_dir(setup),
        "ANTHROPIC_BASE_URL": anthropic_base_url(setup),
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(setup.max_output_tokens),
        "API_TIMEOUT_MS": str(int(options.request_timeout_s * 1000)),
    })
    if not options.retries:
        env["CLAUDE_CODE_MAX_RETRIES"] = "0"
    if options.compaction:
        env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] = str(setup.context_window)
    else:
        env["DISABLE_COMPACT"] = "1"
    if setup.endpoint.extra_headers:
        env["ANTHROPIC_CUSTOM_HEADERS"] = "\n".join(f"{k}: {v}" for k, v in setup.endpoint.extra_headers.items())
    return env


def claude_command(setup: HarnessSetup, prompt: str, executable: str) -> tuple[list[str], str | None]:
    argv = [
        executable, "-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions",
        "--no-session-persistence", "--strict-mcp-config", "--model", setup.model, *setup.options.extra_args,
        "--", prompt,  # after "--" a prompt starting with "-" is still the prompt; stdin stays empty
    ]  # fmt: skip
    return argv, None


def _failure(exit_code: int | None, error: str, tool_calls: list[dict[str, Any]]) -> HarnessResult:
    return HarnessResult(ok=False, exit_code=exit_code if exit_code else 1, process_exit_code=exit_code,
                         final_answer=None, error=error, tool_calls=tool_calls)


def parse_claude_output(exit_code: int | None, stdout: str, stderr: str) -> HarnessResult:
    """Exit status and final answer of ``claude -p --output-format stream-json`` (its ``result`` line)."""
    events = parse_jsonl(stdout)
    tool_calls: list[dict[str, Any]] = []
    for event in events:
        message = event.get("message") if event.get("type") == "assistant" else None
        for block in (message or {}).get("content") or []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                tool_calls.append({"id": block.get("id"), "name": block.get("name"), "input": block.get("input")})
    if exit_code is None:
        return _failure(None, "claude did not exit (killed or timed out)", tool_calls)
    results = [e for e in events if e.get("type") == "result"]
    result = results[-1] if results else None
    if result is None:
        return _failure(exit_code, last_stderr_line(stderr) or f"claude exited with status {exit_code} and no result",
                        tool_calls)
    if exit_code != 0 or result.get("is_error") or result.get("subtype") != "success":
        status = result.get("api_error_status")
        reason = str(result.get("result") or result.get("subtype") or "error")
        return _failure(exit_code, f"{status} {reason}" if status else reason, tool_calls)
    return HarnessResult(ok=True, exit_code=0, process_exit_code=0, final_answer=str(result.get("result") or ""),
                         tool_calls=tool_calls)


CLAUDE_CODE = HarnessPreset(
    name="claude-code",
    append_system_prompt_flag="--append-system-prompt",
    system_prompt_flag="--system-prompt",
    npm_package="@anthropic-ai/claude-code",
    version="2.1.332",
    bin_name="claude",
    binary="node_modules/.bin/claude",
    aux_rules=(
        # Captured (tests/data/harness_capture/claude-code/title): the session-title call, on the
        # haiku-class model and without tools, in interactive runs.
        AuxRule(name="claude-code-title",
                when=AuxCondition(no_tools=True, system_prompt_contains="You are naming a coding session")),
    ),
    offline_env={
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
        "IS_SANDBOX": "1",
    },
    files=claude_files,
    env=claude_env,
    command=claude_command,
    parse=parse_claude_output,
    # bin/claude.exe is a 500-byte stub until the package's postinstall links the native binary of
    # the platform package in its place; with install scripts off, the installer runs it.
    postinstall=("node", "node_modules/@anthropic-ai/claude-code/install.cjs"),
    shell_tool=("Bash", "command"),
    dialect="anthropic",
)
