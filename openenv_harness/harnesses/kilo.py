"""The Kilo Code CLI preset (``@kilocode/cli``), an OpenCode fork that speaks chat completions.

Version: 7.7.7, not the registry's newest 7.8.1. The ``@kilocode/cli`` package is a launcher plus
a postinstall script; the program is a Bun-compiled binary in a platform package
(``@kilocode/cli-linux-x64`` and its ``-baseline``/``-musl`` variants), pinned by the launcher as
optional dependencies of the same version. For 7.8.1 the registry serves the launcher but none of
the Linux binary packages (``npm install`` answers ETARGET for each, and the postinstall's own
``npm install`` fallback fails the same way), so 7.8.1 cannot be installed on Linux here. 7.7.7 is
the newest version whose launcher and ``cli-linux-x64`` binary are both served. The launcher finds
the binary by walking up ``node_modules`` even when install scripts are off; the installer still
runs the package's ``postinstall.mjs`` as a repair step (it hard-links the binary to
``bin/.kilo`` and copies its tree-sitter grammars beside it).

How it takes the endpoint (read in the binary's embedded sources): Kilo keeps OpenCode's config
loader under its own names. The global config is ``$XDG_CONFIG_HOME/kilo/kilo.json`` (it also reads
``config.json``, ``kilo.jsonc`` and ``opencode.json[c]`` there); the recorder is an
``@ai-sdk/openai-compatible`` provider whose ``apiKey`` is ``{env:OPENENV_HARNESS_API_KEY}``, and
``enabled_providers`` lists only it, so the built-in Kilo Gateway provider (which lists its models
from the Kilo API) is never loaded. The file carries Kilo's ``$schema``: without one, Kilo writes it
into the file at start, which would change the file after its hash was taken; so does a one-time
migration that adds ``permission.bash: "allow"`` to a global config without it, so the file has it.
One task runs headless with ``kilo run --format json --auto`` and the prompt on stdin (as for
OpenCode); ``--auto`` approves every permission not explicitly denied, which the sandbox makes safe.

Offline by construction: ``KILO_DISABLE_*`` variables (no models.dev catalogue, no autoupdate, no
share or session ingest to Kilo's servers, no LSP downloads, no default plugins, no Claude Code or
external skills, no project config), ``KILO_TELEMETRY_LEVEL=off`` plus ``experimental.openTelemetry:
false`` (its PostHog client is otherwise on), ``KILO_DISABLE_PRESENCE`` (its session-viewers
socket) and ``KILO_NO_DAEMON`` (no background server). Unlike OpenCode, Kilo installs
``@kilocode/plugin`` into a config directory only when a ``file://`` plugin is configured, so no
plugin markers are needed. Web fetch is off unless asked for; web search is off in Kilo by default.
As OpenCode, it downloads ripgrep when ``rg`` is not on PATH and the model calls grep/glob: provide
``rg`` in the sandbox for fully hermetic runs.

Retries: Kilo retries a failed call up to 5 times, and a connection error ("offline") without
end, every ~5 s -- a run whose recorder is gone would hang until its timeout.
``KILO_SESSION_RETRY_LIMIT`` bounds both; it takes a positive integer only, so "off" is one retry
(byte-identical: the recorder answers it from the first attempt's record).

Output: OpenCode's JSON lines (``step_start``, ``tool_use``, ``text``, ``step_finish``, ``error``);
the exit status is 1 on an unrecoverable error, with the server's message in an ``error`` event.

What the model sees: Kilo's own system prompt and 15 tools (``bash``, file tools, and Kilo's
``task``, ``todowrite``, ``skill``, board, wake-up, background-process and local-recall tools), and
the prompt as the first of two text parts of the user message; the second is an
``<environment_details>`` block with the message time and the working directory.
``config_overrides={"tools": {name: False}}`` removes a tool (and its part of the system prompt).

Its own calls: the hidden ``title`` agent (off unless ``title_call``; ``kilo run`` made none in our
runs even when on) and ``compaction`` agent (off unless ``compaction``), both without tools; their
system message is Kilo's persona header followed by the agent's prompt.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from openenv_harness.harnesses.base import (
    PROVIDER_ID,
    AuxCondition,
    AuxRule,
    HarnessPreset,
    HarnessResult,
    HarnessSetup,
    deep_merge,
)
from openenv_harness.harnesses.opencode import parse_run_events, provider_options

#: Kilo writes this ``$schema`` into a config file that has none.
SCHEMA = "https://app.kilo.ai/config.json"
#: The opening words of the prompts of Kilo's hidden ``title`` and ``compaction`` agents (7.7.7).
TITLE_MARKER = "You are a title generator. You output ONLY a thread title."
COMPACTION_MARKER = "You are a context summarization agent."
#: ``KILO_SESSION_RETRY_LIMIT`` with retries off (its minimum) and on (its default count).
RETRIES_OFF, RETRIES_ON = "1", "5"


def config_dir(setup: HarnessSetup) -> str:
    return posixpath.join(setup.home, ".config", "kilo")


def _config(setup: HarnessSetup) -> dict[str, Any]:
    options = setup.options
    config: dict[str, Any] = {
        "$schema": SCHEMA,
        "provider": {
            PROVIDER_ID: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Rollout recorder",
                "options": provider_options(setup),
                "models": {
                    setup.model: {
                        "name": setup.model,
                        "tool_call": True,
                        "reasoning": options.reasoning,
                        # Kilo sends max_tokens = output and compacts at context - output.
                        "limit": {"context": setup.context_window, "output": setup.max_output_tokens},
                    }
                },
            }
        },
        "enabled_providers": [PROVIDER_ID],
        "model": f"{PROVIDER_ID}/{setup.model}",
        "small_model": f"{PROVIDER_ID}/{setup.model}",
        "autoupdate": False,
        "share": "disabled",
        # No git shadow copy of the task's directory under the data dir.
        "snapshot": False,
        "experimental": {"openTelemetry": False},
        # What Kilo's one-time bash-permission migration writes into a global config without it.
        "permission": {"bash": "allow"},
        "agent": {"title": {"disable": not options.title_call}},
        # Pruning clears old tool outputs in the history: a rewrite, like compaction.
        "compaction": {"auto": options.compaction, "prune": options.compaction},
    }
    if not options.webfetch:
        config["tools"] = {"webfetch": False}
    return deep_merge(config, options.config_overrides)


def kilo_files(setup: HarnessSetup) -> dict[str, str]:
    return {posixpath.join(config_dir(setup), "kilo.json"): json.dumps(_config(setup), indent=2) + "\n"}


def kilo_env(setup: HarnessSetup) -> dict[str, str]:
    return {"KILO_SESSION_RETRY_LIMIT": RETRIES_ON if setup.options.retries else RETRIES_OFF}


def kilo_command(setup: HarnessSetup, prompt: str, executable: str) -> tuple[list[str], str | None]:
    argv = [executable, "run", "--format", "json", "--auto", "-m", f"{PROVIDER_ID}/{setup.model}",
            *setup.options.extra_args]
    return argv, prompt


def parse_kilo_output(exit_code: int | None, stdout: str, stderr: str) -> HarnessResult:
    """Exit status and final answer of ``kilo run --format json``: OpenCode's event stream."""
    return parse_run_events("kilo", exit_code, stdout, stderr)


KILO = HarnessPreset(
    name="kilo",
    npm_package="@kilocode/cli",
    version="7.7.7",
    bin_name="kilo",
    binary="node_modules/.bin/kilo",
    aux_rules=(
        # Kilo's hidden ``title`` and ``compaction`` agents: no tools, and a system message that is
        # Kilo's persona header ("You are Kilo, ...") followed by the agent's own prompt, so the
        # marker is *contained*, not leading (seen in a recorded compaction call).
        AuxRule(name="kilo-title",
                when=AuxCondition(no_tools=True, system_prompt_contains=TITLE_MARKER)),
        AuxRule(name="kilo-compaction",
                when=AuxCondition(no_tools=True, system_prompt_contains=COMPACTION_MARKER)),
    ),
    offline_env={
        "KILO_DISABLE_AUTOUPDATE": "1",
        "KILO_DISABLE_SHARE": "1",
        "KILO_DISABLE_SESSION_INGEST": "1",
        "KILO_DISABLE_MODELS_FETCH": "1",
        "KILO_DISABLE_LSP_DOWNLOAD": "1",
        "KILO_DISABLE_DEFAULT_PLUGINS": "1",
        "KILO_DISABLE_CLAUDE_CODE": "1",
        "KILO_DISABLE_EXTERNAL_SKILLS": "1",
        "KILO_DISABLE_PROJECT_CONFIG": "1",
        "KILO_DISABLE_PRESENCE": "1",
        "KILO_TELEMETRY_LEVEL": "off",
        "KILO_NO_DAEMON": "1",
    },
    files=kilo_files,
    env=kilo_env,
    command=kilo_command,
    parse=parse_kilo_output,
    # The launcher finds the platform binary without it; the script links it beside the launcher.
    postinstall=("node", "node_modules/@kilocode/cli/postinstall.mjs"),
    recommends=("rg",),
)
