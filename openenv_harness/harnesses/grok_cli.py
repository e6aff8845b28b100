"""The Grok CLI preset (``@vibe-kit/grok-cli``), an open-source agent that speaks chat completions.

How it finds its model (``dist/index.js``, ``dist/utils/settings-manager.js``, ``dist/grok/client.js``
in 0.0.34): the key is ``--api-key``, else ``GROK_API_KEY``, else ``apiKey`` in
``~/.grok/user-settings.json``; the base URL is ``--base-url``, else ``GROK_BASE_URL``, else that
file's ``baseURL`` (default ``https://api.x.ai/v1``); the model is ``--model``, else ``GROK_MODEL``.
Both flags are avoided on purpose: the CLI *writes* a flag's key or URL into the user settings file
(and says so on stdout). So the recorder's ``<recorder>/rollout/<session>/v1`` (the OpenAI SDK appends
``/chat/completions``) and the key travel in the environment; the settings file the preset places in
the sandbox's ``$HOME/.grok`` names the same URL and model and never holds the key. Replies are capped
by ``GROK_MAX_TOKENS`` (``max_tokens``; 1536 when unset); temperature is fixed at 0.7 in the CLI.

One task runs headless with ``grok --prompt=<prompt>`` (the ``=`` form keeps a prompt that starts
with ``-`` one option value). Headless mode auto-approves every tool, calls the model without
streaming, and prints the conversation as JSON lines of OpenAI messages (user, assistant with
``tool_calls``, tool). It exits 0 even when a model call failed: the error becomes the last assistant
message, ``"Sorry, I encountered an error: ..."``, and a run that reaches ``--max-tool-rounds`` ends
on ``"Maximum tool execution rounds reached. ..."``; ``parse_grok_output`` turns both into failures.

Offline: besides the model, only two things could leave the machine. Its Morph ``edit_file`` tool
posts to Morph's API when ``MORPH_API_KEY`` is set: the variable is set empty, which also keeps a
``.env`` in the task's directory (the CLI loads one with dotenv, which never overrides a variable
that is set) from turning it on. MCP servers come only from the task directory's
``.grok/settings.json`` (``mcpServers``): a task that ships one would start them -- there is no
switch. The CLI has no telemetry, update check or web tool of its own (its "web search" is an xAI
server-side option, ``search_parameters``, sent as ``{"mode": "off"}`` unless the model name contains
"grok" and the prompt asks for news). Its ``search`` tool runs ``rg`` from PATH (never downloaded).

Aux calls: none. Headless Grok CLI makes no title, summary or compaction call; every call carries its
tools, so any tool-less call the recorder ever saw would fall to the generic ``no-tools`` rule.

Quirks: ``--version`` prints a hard-coded ``1.0.1`` (hence ``reported_version``); the CLI creates
``.grok/settings.json`` (``{"model": "grok-code-fast-1"}``) in the task's directory when it has none
(its project settings, read for the model and MCP servers; the ``--model`` flag wins over it); a
``.grok/GROK.md`` there or in ``$HOME/.grok`` is added to its system prompt as custom instructions;
the OpenAI SDK's own retries (2) and 360 s timeout are hard-coded; it can send no extra headers.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from openenv_harness.harnesses.base import (
    HarnessPreset,
    HarnessResult,
    HarnessSetup,
    deep_merge,
    last_stderr_line,
    parse_jsonl,
)

#: ``settingsVersion`` of 0.0.34's user settings; an older one makes the CLI rewrite the file.
SETTINGS_VERSION = 2
#: The CLI's own bound on tool rounds (its default is 400).
MAX_TOOL_ROUNDS = 100
#: How the headless CLI reports a failed model call (as the last assistant message, exit 0).
ERROR_PREFIX = "Sorry, I encountered an error: "
#: How it reports that the run hit ``--max-tool-rounds``.
ROUNDS_EXHAUSTED = "Maximum tool execution rounds reached."


def settings_path(setup: HarnessSetup) -> str:
    return posixpath.join(setup.home, ".grok", "user-settings.json")


def _user_settings(setup: HarnessSetup) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "baseURL": setup.base_url,
        "defaultModel": setup.model,
        "models": [setup.model],
        "settingsVersion": SETTINGS_VERSION,
    }
    return deep_merge(settings, setup.options.config_overrides)


def grok_files(setup: HarnessSetup) -> dict[str, str]:
    return {settings_path(setup): json.dumps(_user_settings(setup), indent=2) + "\n"}


def grok_env(setup: HarnessSetup) -> dict[str, str]:
    if setup.endpoint.extra_headers:
        raise ValueError("grok-cli cannot send extra headers: it has no header setting")
    return {
        "GROK_BASE_URL": setup.base_url,
        # The CLI reads its key from this variable only (or a file, or a flag that writes the file).
        "GROK_API_KEY": setup.endpoint.api_key,
        "GROK_MODEL": setup.model,
        "GROK_MAX_TOKENS": str(setup.max_output_tokens),
    }


def grok_command(setup: HarnessSetup, prompt: str, executable: str) -> tuple[list[str], str | None]:
    argv = [executable, "--model", setup.model, "--max-tool-rounds", str(MAX_TOOL_ROUNDS),
            *setup.options.extra_args, f"--prompt={prompt}"]
    return argv, None


def _tool_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    calls = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            function = call.get("function") or {}
            arguments = function.get("arguments")
            try:
                parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
            except ValueError:
                parsed = arguments
            calls.append({"id": call.get("id"), "name": function.get("name"), "input": parsed})
    return calls


def parse_grok_output(exit_code: int | None, stdout: str, stderr: str) -> HarnessResult:
    """Exit status and final answer of ``grok --prompt``: its last assistant message, unless that
    message is how the CLI reports an error or exhausted tool rounds."""
    messages = [m for m in parse_jsonl(stdout) if m.get("role") in ("user", "assistant", "tool")]
    tool_calls = _tool_calls(messages)
    replies = [m for m in messages if m.get("role") == "assistant"]
    last = str(replies[-1].get("content") or "") if replies else None
    if exit_code is None:
        error = "grok did not exit (killed or timed out)"
    elif exit_code != 0:
        error = last or last_stderr_line(stderr) or f"grok exited with status {exit_code}"
    elif last is None:
        error = last_stderr_line(stderr) or "grok printed no assistant message"
    elif last.startswith(ERROR_PREFIX):
        error = last[len(ERROR_PREFIX):]
    elif last.startswith(ROUNDS_EXHAUSTED):
        error = last
    else:
        return HarnessResult(ok=True, exit_code=0, process_exit_code=0, final_answer=last, tool_calls=tool_calls)
    return HarnessResult(ok=False, exit_code=exit_code if exit_code else 1, process_exit_code=exit_code,
                         final_answer=None, error=error, tool_calls=tool_calls)


GROK_CLI = HarnessPreset(
    name="grok-cli",
    npm_package="@vibe-kit/grok-cli",
    version="0.0.34",
    reported_version="1.0.1",
    bin_name="grok",
    binary="node_modules/.bin/grok",
    aux_rules=(),
    offline_env={"MORPH_API_KEY": ""},
    files=grok_files,
    env=grok_env,
    command=grok_command,
    parse=parse_grok_output,
    # dist/index.js starts with "#!/usr/bin/env node".
    requires=("node",),
    shell_tool=("bash", "command"),
    dialect="chat",
)
