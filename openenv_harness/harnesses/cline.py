"""The Cline CLI preset (``cline``), which speaks OpenAI chat completions with native tool calls.

How 3.0.65 takes a provider (read from its package: the ``cline`` npm wrapper runs a Bun-compiled
binary whose bundled ``@cline/core``/``@cline/llms`` 0.0.86 also ship as readable ``dist/`` files):

- Settings live under ``$CLINE_DIR`` (default ``~/.cline``); its data directory ``$CLINE_DATA_DIR``
  (default ``$CLINE_DIR/data``) holds ``settings/providers.json`` (provider settings by id) and
  ``settings/global-settings.json`` (behaviour). The preset sets both variables to the sandbox home,
  so nothing is read from or written to the user's home.
- The built-in ``openai-compatible`` provider is the AI SDK's ``@ai-sdk/openai-compatible`` client:
  it posts to ``<baseUrl>/chat/completions`` (streaming, ``tools`` with ``tool_choice: auto``) and,
  when ``providers.json`` holds no ``apiKey``, takes the key from ``OPENAI_API_KEY`` (its manifest's
  ``apiKeyEnv``). So the file names the base URL and model, never the key.
- Tool calls are native chat-completions ``tool_calls``, not XML in text. The shell tool is
  ``run_commands``; its schema declares ``commands`` as an array of strings, and its input parser
  also accepts a single string there, which is what the scripted tasks send.
- ``max_tokens`` is Cline's own: ``min(32000, contextWindow - estimated prompt - 1024)`` with the
  estimate ``len(json(system, messages, tools)) / 4``. 3.0.65 drops the ``maxTokens`` provider
  setting on the way to the request (the agent runtime overwrites it with its unset per-turn
  limit), so ``HarnessSetup.max_output_tokens`` cannot be enforced; ``contextWindow`` is the
  setup's context window, which keeps prompt + ``max_tokens`` inside it.

One task runs headless as ``cline --json --auto-approve true -P openai-compatible -m <model>
--compaction off -- <prompt>``; Cline trims the prompt it sends, and stdin stays empty (piped stdin
would be appended to the prompt). Act mode, not ``--yolo``: yolo mode
only ends a run through its ``submit_and_exit`` tool, drops a text-only reply from the history and
asks again, forever; act mode ends on the first reply without tool calls, as the other agents do.
``--system <text>`` (``HarnessOptions.system_prompt``) replaces the whole system prompt: the request's
system message is that text alone; Cline has no flag that appends to its own.

Offline by construction:

- ``CLINE_SESSION_BACKEND_MODE=local``: without it the CLI starts a detached hub daemon (a
  loopback server that outlives the run) and runs the session there.
- ``telemetryOptOut: true`` in ``global-settings.json``: without it the OpenTelemetry exporter
  posts to otel.cline.bot.
- ``IS_TEST=true``: the CLI's feature-flag client polls PostHog (data.cline.bot) on every start;
  this variable is the one switch 3.0.65 reads to use its no-op flag provider instead.
- ``CLINE_NO_AUTO_UPDATE=1`` and ``autoUpdateEnabled: false``: no npm update check.
- ``fetch_web_content`` and ``web_search`` are disabled unless web access is asked for; the
  ``spawn_agent`` and ``team_*`` tools are disabled too: a sub-agent or teammate is a second
  conversation of its own through the same endpoint, which no single chain can hold.

Output: JSON lines -- ``agent_event`` (``content_start`` of a tool: ``toolName``, ``toolCallId``,
``input``), ``hook_event``, ``error`` (``message``), and a final ``run_result`` with
``finishReason`` (``completed``, ``error``, ``aborted``, ``max_iterations``, ``mistake_limit``) and
``text``. The exit status is 1 for a finish other than ``completed`` except ``aborted``, which
exits 0 -- so success is read from ``finishReason``.
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

#: Cline's built-in provider for any OpenAI-compatible chat-completions endpoint.
PROVIDER = "openai-compatible"
#: The system prompt of Cline's agentic compaction summary (a tool-less call of its own).
COMPACTION_PROMPT = "Summarize the provided coding session into a concise continuation note"
#: Cline's tools that reach the web.
WEB_TOOLS = ("fetch_web_content", "web_search")
#: Tools that start another conversation through the same endpoint (a sub-agent, teammates).
SUBAGENT_TOOLS = (
    "spawn_agent", "team_spawn_teammate", "team_shutdown_teammate", "team_status", "team_task", "team_run_task",
    "team_cancel_run", "team_list_runs", "team_await_runs", "team_send_message", "team_broadcast",
    "team_read_mailbox", "team_mission_log", "team_cleanup", "team_create_outcome",
    "team_attach_outcome_fragment", "team_review_outcome_fragment", "team_finalize_outcome", "team_list_outcomes",
)  # fmt: skip
#: A fixed ``updatedAt``, so the placed file (and its hash) is the same for every rollout.
_UPDATED_AT = "2025-01-01T00:00:00.000Z"


def cline_dir(setup: HarnessSetup) -> str:
    return posixpath.join(setup.home, ".cline")


def data_dir(setup: HarnessSetup) -> str:
    return posixpath.join(cline_dir(setup), "data")


def _providers(setup: HarnessSetup) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "provider": PROVIDER,
        "model": setup.model,
        "baseUrl": setup.base_url,
        "contextWindow": setup.context_window,
        "timeout": int(setup.options.request_timeout_s * 1000),
    }
    if setup.endpoint.extra_headers:
        settings["headers"] = dict(setup.endpoint.extra_headers)
    entry = {"settings": settings, "updatedAt": _UPDATED_AT, "tokenSource": "manual"}
    return {"version": 1, "lastUsedProvider": PROVIDER, "modes": {}, "providers": {PROVIDER: entry}}


def _global_settings(setup: HarnessSetup) -> dict[str, Any]:
    options = setup.options
    disabled = [*SUBAGENT_TOOLS, *(() if options.webfetch else WEB_TOOLS)]
    settings: dict[str, Any] = {
        "telemetryOptOut": True,
        "autoUpdateEnabled": False,
        "compactionEnabled": options.compaction,
        "toolAutoApprove": True,
        "disabledTools": disabled,
        "tools": {"web_search": {"enabled": options.webfetch}},
    }
    return deep_merge(settings, options.config_overrides)


def cline_files(setup: HarnessSetup) -> dict[str, str]:
    settings = posixpath.join(data_dir(setup), "settings")
    return {
        posixpath.join(settings, "providers.json"): json.dumps(_providers(setup), indent=2) + "\n",
        posixpath.join(settings, "global-settings.json"): json.dumps(_global_settings(setup), indent=2) + "\n",
    }


def cline_env(setup: HarnessSetup) -> dict[str, str]:
    return {
        "CLINE_DIR": cline_dir(setup),
        "CLINE_DATA_DIR": data_dir(setup),
        # read by the openai-compatible provider when providers.json names no key
        "OPENAI_API_KEY": setup.endpoint.api_key,
    }


def cline_command(setup: HarnessSetup, prompt: str, executable: str) -> tuple[list[str], str | None]:
    # Cline refuses a prompt argument without whitespace (it takes it for a mistyped command) and trims
    # the prompt it sends: a trailing space gets a one-word prompt past the check and is gone again.
    # (JSON mode takes no prompt from stdin alone.)
    argument = prompt if any(c.isspace() for c in prompt) else prompt + " "
    argv = [
        executable, "--json", "--auto-approve", "true", "-P", PROVIDER, "-m", setup.model,
        "--compaction", "agentic" if setup.options.compaction else "off",
        *setup.options.extra_args,
        # "--" ends the options: a prompt starting with "-" stays the prompt
        "--", argument,
    ]  # fmt: skip
    return argv, None


def parse_cline_output(exit_code: int | None, stdout: str, stderr: str) -> HarnessResult:
    """Exit status and final answer of ``cline --json`` (its ``run_result`` line)."""
    events = parse_jsonl(stdout)
    tool_calls = []
    for event in events:
        inner = event.get("event") if event.get("type") == "agent_event" else None
        if isinstance(inner, dict) and inner.get("type") == "content_start" and inner.get("contentType") == "tool":
            tool_calls.append({"id": inner.get("toolCallId"), "name": inner.get("toolName"), "input": inner.get("input")})
    errors = [str(e.get("message")) for e in events if e.get("type") == "error" and e.get("message")]
    results = [e for e in events if e.get("type") == "run_result"]
    result = results[-1] if results else None
    if exit_code is None:
        error = "cline did not exit (killed or timed out)"
    elif result is None:
        error = errors[-1] if errors else last_stderr_line(stderr) or f"cline exited with status {exit_code} and no result"
    elif exit_code != 0 or result.get("finishReason") != "completed":
        reason = result.get("finishReason")
        error = errors[-1] if errors else str(result.get("text") or f"finishReason={reason}")
    else:
        return HarnessResult(ok=True, exit_code=0, process_exit_code=0, final_answer=str(result.get("text") or ""),
                             tool_calls=tool_calls)
    return HarnessResult(ok=False, exit_code=exit_code if exit_code else 1, process_exit_code=exit_code,
                         final_answer=None, error=error, tool_calls=tool_calls)


CLINE = HarnessPreset(
    name="cline",
    npm_package="cline",
    version="3.0.65",
    bin_name="cline",
    binary="node_modules/.bin/cline",
    aux_rules=(
        # Agentic compaction (on only with HarnessOptions.compaction): no tools, its own system prompt.
        AuxRule(name="cline-compaction",
                when=AuxCondition(no_tools=True, system_prompt_startswith=COMPACTION_PROMPT)),
    ),
    offline_env={
        "CLINE_SESSION_BACKEND_MODE": "local",
        "CLINE_NO_AUTO_UPDATE": "1",
        "IS_TEST": "true",
    },
    files=cline_files,
    env=cline_env,
    command=cline_command,
    parse=parse_cline_output,
    # bin/cline is a "#!/usr/bin/env node" launcher for the platform package's compiled binary
    requires=("node",),
    # its file search and workspace index run ripgrep; its checkpoints run git
    recommends=("rg", "git"),
    shell_tool=("run_commands", "commands"),
    system_prompt_flag="--system",
    dialect="chat",
)
