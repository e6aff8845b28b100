"""The Gemini CLI preset (``@google/gemini-cli``), which speaks only Google's ``generateContent`` API.

Gemini CLI is pointed at the recorder with ``GOOGLE_GEMINI_BASE_URL = <recorder>/rollout/<session>``:
its API-key authentication (``security.auth.selectedType: gemini-api-key``) takes that base URL, and its SDK (``@google/genai``)
appends ``/v1beta/models/<model>:streamGenerateContent?alt=sse`` (or ``:generateContent``) and
sends ``GEMINI_API_KEY`` as ``x-goog-api-key``. The key travels in the environment only.
One task runs headless with ``gemini -p <prompt> --output-format stream-json --approval-mode yolo``.

Settings live in the sandbox's ``$HOME/.gemini/settings.json`` (never the user's home): usage
statistics, telemetry, the update check and its nag are off (they would reach Google), the
next-speaker check and loop detection -- tool-less ``generateContent`` calls of the CLI's own,
never the policy's turn -- are off, the model router is pinned to the policy model, and
``web_fetch``/``google_web_search`` are excluded unless web access is asked for. Compaction
(``model.compressionThreshold``) is off unless asked for; when on, its summary call is classified.

Output: JSON lines -- ``init``, ``message`` (``role`` user/assistant, ``delta``), ``tool_use``
(``tool_name``, ``parameters``), ``tool_result``, and a final ``result`` with ``status`` and stats.

Replay (what the recorder sees next turn): ``functionCall.args`` comes back as a parsed JSON object,
so the recorder restores the argument text the model sampled (``recorder/dialects/memory.py``),
exactly as for Claude Code.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from openenv_harness.harnesses.base import (
    AuxCondition,
    AuxRule,
    HarnessPreset,
    HarnessResult,
    HarnessSetup,
    deep_merge,
    last_stderr_line,
    parse_jsonl,
)

#: The opening task of Gemini CLI's compression prompt, in both of its compression calls.
COMPRESSION_MARKER = "distilling chat history into a structured XML <state_snapshot>"
#: Gemini CLI's tools that reach the web.
WEB_TOOLS = ("web_fetch", "google_web_search")


def gemini_base_url(setup: HarnessSetup) -> str:
    """The recorder's session base without ``/v1``: the SDK adds ``/v1beta/models/...`` itself."""
    base = setup.base_url
    return base[: -len("/v1")] if base.endswith("/v1") else base


def _settings(setup: HarnessSetup) -> dict[str, Any]:
    options = setup.options
    settings: dict[str, Any] = {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False, "logPrompts": False},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False, "checkpointing": {"enabled": False}},
        "model": {
            "name": setup.model,
            "skipNextSpeakerCheck": True,
            "disableLoopDetection": True,
            "maxSessionTurns": 100,
            # a fraction of the context window; above 1 it never triggers
            "compressionThreshold": 0.7 if options.compaction else 2.0,
        },
        "experimental": {"useModelRouter": False},
        "ide": {"enabled": False},
        "ui": {"hideBanner": True, "hideTips": True},
    }
    if not options.webfetch:
        settings["tools"] = {"exclude": list(WEB_TOOLS)}
    return deep_merge(settings, options.config_overrides)


def gemini_files(setup: HarnessSetup) -> dict[str, str]:
    return {posixpath.join(setup.home, ".gemini", "settings.json"): json.dumps(_settings(setup), indent=2) + "\n"}


def gemini_env(setup: HarnessSetup) -> dict[str, str]:
    env = {
        "GOOGLE_GEMINI_BASE_URL": gemini_base_url(setup),
        "GEMINI_API_KEY": setup.endpoint.api_key,
        "GEMINI_MODEL": setup.model,
        "GEMINI_CLI_HOME": setup.home,
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
    }
    if setup.endpoint.extra_headers:
        env["GEMINI_CLI_CUSTOM_HEADERS"] = ",".join(f"{k}:{v}" for k, v in setup.endpoint.extra_headers.items())
    return env


def gemini_command(setup: HarnessSetup, prompt: str, executable: str) -> tuple[list[str], str | None]:
    argv = [executable, "--output-format", "stream-json", "--approval-mode", "yolo", "--skip-trust",
            "--model", setup.model, *setup.options.extra_args, "--prompt", prompt]
    return argv, None


def parse_gemini_output(exit_code: int | None, stdout: str, stderr: str) -> HarnessResult:
    """Exit status and final answer of ``gemini --output-format stream-json`` (its ``result`` line)."""
    events = parse_jsonl(stdout)
    tool_calls = [{"id": e.get("tool_id"), "name": e.get("tool_name"), "input": e.get("parameters")}
                  for e in events if e.get("type") == "tool_use"]
    answer = "".join(str(e.get("content") or "") for e in events
                     if e.get("type") == "message" and e.get("role") == "assistant")
    results = [e for e in events if e.get("type") == "result"]
    result = results[-1] if results else None
    if exit_code is None:
        error = "gemini did not exit (killed or timed out)"
    elif result is None:
        error = last_stderr_line(stderr) or f"gemini exited with status {exit_code} and no result"
    elif exit_code != 0 or result.get("status") != "success":
        detail = result.get("error")
        error = str(detail.get("message") if isinstance(detail, dict) else detail or result.get("status") or "error")
    else:
        return HarnessResult(ok=True, exit_code=0, process_exit_code=0, final_answer=answer, tool_calls=tool_calls)
    return HarnessResult(ok=False, exit_code=exit_code if exit_code else 1, process_exit_code=exit_code,
                         final_answer=None, error=error, tool_calls=tool_calls)


GEMINI_CLI = HarnessPreset(
    name="gemini-cli",
    npm_package="@google/gemini-cli",
    version="0.61.0",
    bin_name="gemini",
    binary="node_modules/.bin/gemini",
    aux_rules=(
        # Gemini CLI's compression (its summary call and the self-check that follows it): no tools,
        # and the snapshot task as the system instruction (``getCompressionPrompt`` in 0.61.0).
        AuxRule(name="gemini-cli-compression",
                when=AuxCondition(no_tools=True, system_prompt_contains=COMPRESSION_MARKER)),
    ),
    offline_env={
        "GEMINI_CLI_NO_RELAUNCH": "true",
        "GEMINI_SANDBOX": "false",
        "NO_BROWSER": "true",
    },
    files=gemini_files,
    env=gemini_env,
    command=gemini_command,
    parse=parse_gemini_output,
    shell_tool=("run_shell_command", "command"),
    dialect="gemini",
    system_prompt_file_env="GEMINI_SYSTEM_MD",
)
