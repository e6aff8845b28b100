"""The Continue CLI preset (``@continuedev/cli``, the ``cn`` command).

How it reaches the recorder (read in the package's ``src/`` and ``dist/index.js``, 1.5.47): ``cn -p
--config <file>`` loads a local ``config.yaml`` without any account (``configLoader.ts``: a file
path given to ``--config`` is unrolled locally; the hub login is a stub that always reports
"unauthenticated", ``services/AuthService.ts``). The recorder is one model of that file with
``provider: openai`` and ``apiBase: <recorder>/rollout/<session>/v1``: Continue's OpenAI adapter
hands ``apiBase`` to the ``openai`` SDK, which posts to ``<apiBase>/chat/completions``, always
streamed with ``stream_options.include_usage``. The key is never written: ``apiKey`` is the
template ``${{ secrets.OPENENV_HARNESS_API_KEY }}``, which the CLI resolves from its own
environment first (``CLIPlatformClient.findSecretInProcessEnv``) -- only a secret missing there
would be asked of the hub. Every file lives under ``CONTINUE_GLOBAL_DIR`` = ``$HOME/.continue`` of
the sandbox (config, ``permissions.yaml``, sessions, logs), never the user's home.

Offline: metrics (OpenTelemetry, only with ``OTEL_*`` set) are off with ``CONTINUE_METRICS_ENABLED=0``;
there is no PostHog in 1.5.47. One call has no switch: importing ``src/version.ts`` starts
``fetch("https://api.continue.dev/cn/info?id=<machine id>")`` for the latest version, which the
update service -- it runs headless too -- would install with ``npm i -g @continuedev/cli`` when
newer. Model calls go through the CLI's own
``node-fetch``, never Node's global ``fetch``; so ``NODE_OPTIONS`` imports a one-line data-URL
module that removes the global ``fetch`` (the version call then fails inside its own ``try``,
before any DNS lookup, and the update check finds no version) and takes ``NODE_OPTIONS`` back out of
the environment, so the commands the agent runs get Node as it is. With ``webfetch`` on, the
``Fetch`` tool needs the global ``fetch``: nothing is removed and the version call goes out.

Tools: headless ``cn`` offers ``Bash`` (``command``; ``$SHELL -l -c``), ``Read``, ``List``, ``Search``
(only when ``rg`` is on PATH), ``Checklist``, ``CheckBackgroundJob``, ``Skills``, ``Exit`` and
``Edit`` or ``MultiEdit`` (``MultiEdit`` when the model *name* matches a known family, e.g. qwen,
llama, gpt). Headless it drops every tool whose permission is "ask" (``Write``, ``Edit``,
``MultiEdit``), so ``permissions.yaml`` allows them; ``--auto`` would too, but it also ignores every
exclusion. Excluded: ``Fetch`` (the web) unless asked for, and ``AskQuestion``, which waits for an
answer no headless run can give.

Aux calls: in ``-p`` mode the title call never runs (``chat.ts`` passes ``firstAssistantResponse``
after clearing it). Compaction cannot be switched off, only kept out of reach: it triggers on the
CLI's own token estimate against ``defaultCompletionOptions.contextLength``, so the preset declares a
context it never reaches unless ``compaction`` is asked for. Its summary call keeps the system prompt
and the tools and ends with the user message ``COMPACTION_MARKER``: rule ``continue-compaction``.

Output: ``-p`` prints only the final text (tool calls are not shown), exit 0; any error is one JSON
line ``{"status": "error", "message": ...}`` on stderr and exit 1. ``--format json`` would change
the system prompt (it demands a JSON answer), so it is not used.

Not configurable here: retries (the CLI retries 429/502/503/504 and network errors up to 10 times,
the ``openai`` SDK twice more; a recorder that wants a run to stop answers another 4xx) and the
request timeout (``requestOptions.timeout`` is read as seconds by the CLI's HTTP agent and as
milliseconds by the SDK, so it is left at their defaults). From the task's directory the CLI reads
``AGENTS.md``/``CLAUDE.md`` and ``.continue/rules`` into its system prompt, hooks from
``.claude/settings.json``/``.continue/settings.json``, and ``.env`` into its own environment.
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
)

#: The opening words of the user message Continue appends for its compaction summary (``compaction.ts``).
COMPACTION_MARKER = "Please provide a concise summary of our conversation so far"
#: The context the CLI is told when compaction is off: its token estimate never gets near it.
UNREACHED_CONTEXT = 1_000_000_000
#: A module, given to Node as a data URL, that removes the global ``fetch`` from the CLI's process
#: and ``NODE_OPTIONS`` from what its children inherit (spaces are %20: Node splits NODE_OPTIONS on them).
NO_GLOBAL_FETCH = "--import=data:text/javascript,delete%20globalThis.fetch;delete%20process.env.NODE_OPTIONS"
#: Tools a headless run must not have: the web, and a question nobody will answer.
EXCLUDED_TOOLS = ("Fetch", "AskQuestion")
#: Tools whose default is "ask", which headless drops.
WRITE_TOOLS = ("Write", "Edit", "MultiEdit")


def continue_home(setup: HarnessSetup) -> str:
    """``CONTINUE_GLOBAL_DIR``: the CLI's whole state (config, permissions, sessions, logs)."""
    return posixpath.join(setup.home, ".continue")


def config_path(setup: HarnessSetup) -> str:
    return posixpath.join(continue_home(setup), "config.yaml")


def _config(setup: HarnessSetup) -> dict[str, Any]:
    options = setup.options
    model: dict[str, Any] = {
        "name": setup.model,
        "provider": "openai",
        "model": setup.model,
        "apiBase": setup.base_url,
        "apiKey": "${{ secrets." + API_KEY_ENV + " }}",
        "roles": ["chat"],
        "capabilities": ["tool_use"],
        "defaultCompletionOptions": {
            "contextLength": setup.context_window if options.compaction else UNREACHED_CONTEXT,
            "maxTokens": setup.max_output_tokens,
        },
    }
    if setup.endpoint.extra_headers:
        model["requestOptions"] = {"headers": dict(setup.endpoint.extra_headers)}
    config: dict[str, Any] = {"name": "openenv-harness rollout", "version": "1.0.0", "schema": "v1",
                              "models": [model]}
    return deep_merge(config, options.config_overrides)


def _permissions(setup: HarnessSetup) -> dict[str, Any]:
    excluded = [tool for tool in EXCLUDED_TOOLS if tool != "Fetch" or not setup.options.webfetch]
    return {"allow": list(WRITE_TOOLS), "ask": [], "exclude": excluded}


def continue_files(setup: HarnessSetup) -> dict[str, str]:
    # JSON is YAML: both files are read by YAML parsers.
    root = continue_home(setup)
    return {
        config_path(setup): json.dumps(_config(setup), indent=2) + "\n",
        posixpath.join(root, "permissions.yaml"): json.dumps(_permissions(setup), indent=2) + "\n",
    }


def continue_env(setup: HarnessSetup) -> dict[str, str]:
    env = {"CONTINUE_GLOBAL_DIR": continue_home(setup)}
    if setup.options.webfetch:
        env["NODE_OPTIONS"] = ""  # the Fetch tool calls Node's global fetch
    return env


def continue_command(setup: HarnessSetup, prompt: str, executable: str) -> tuple[list[str], str | None]:
    # The prompt is one argument: with -p, cn would prepend any piped stdin to it.
    argv = [executable, "-p", "--config", config_path(setup), *setup.options.extra_args, "--", prompt]
    return argv, None


def _error_message(stderr: str) -> str | None:
    line = last_stderr_line(stderr)
    if line and line.startswith("{"):
        try:
            event = json.loads(line)
        except ValueError:
            return line
        if isinstance(event, dict) and event.get("message"):
            return str(event["message"])
    return line


def parse_continue_output(exit_code: int | None, stdout: str, stderr: str) -> HarnessResult:
    """Exit status and final answer of ``cn -p`` (text mode: stdout is the final answer)."""
    if exit_code == 0:
        return HarnessResult(ok=True, exit_code=0, process_exit_code=0, final_answer=stdout.removesuffix("\n"))
    if exit_code is None:
        error = "cn did not exit (killed or timed out)"
    else:
        # exit 1 with nothing said: the model called the Exit tool ("exit with status 1")
        error = _error_message(stderr) or f"cn exited with status {exit_code}"
    return HarnessResult(ok=False, exit_code=exit_code if exit_code else 1, process_exit_code=exit_code,
                         final_answer=None, error=error)


CONTINUE = HarnessPreset(
    name="continue",
    npm_package="@continuedev/cli",
    version="1.5.47",
    bin_name="cn",
    binary="node_modules/.bin/cn",
    aux_rules=(
        # Continue's compaction call carries its usual system prompt and tools; only its last user
        # message marks it.
        AuxRule(name="continue-compaction",
                when=AuxCondition(no_tools=False, last_user_message_startswith=COMPACTION_MARKER)),
    ),
    offline_env={
        "NODE_OPTIONS": NO_GLOBAL_FETCH,
        "CONTINUE_METRICS_ENABLED": "0",
        "CONTINUE_CLI_ENABLE_TELEMETRY": "0",
        "FORCE_NO_TTY": "true",
    },
    files=continue_files,
    env=continue_env,
    command=continue_command,
    parse=parse_continue_output,
    # dist/cn.js starts with "#!/usr/bin/env node".
    requires=("node",),
    shell_tool=("Bash", "command"),
    dialect="chat",
)
