"""The OpenCode preset (``opencode-ai``).

OpenCode reads ``$XDG_CONFIG_HOME/opencode/opencode.json``; the recorder is declared there as an
``@ai-sdk/openai-compatible`` provider (bundled in the binary: nothing is downloaded). One task runs
headless with ``run --format json`` and the prompt on **stdin**: ``opencode run "a b"`` wraps every
argument that contains a space in literal double quotes, while stdin arrives byte for byte.

Offline by construction: besides the ``OPENCODE_DISABLE_*`` variables (no models.dev catalogue, no
autoupdate, no LSP downloads, no default plugins), OpenCode starts a detached ``npm install
@opencode-ai/plugin`` in its config directory unless that directory already holds ``node_modules/``,
a ``package.json`` listing the plugin and a ``package-lock.json`` whose root lists it -- so the preset
seeds those three. One download remains possible: if ``rg`` is not on PATH and the model calls the
grep/glob tools, OpenCode fetches ripgrep; provide ``rg`` in the sandbox for fully hermetic runs.

Output: JSON lines (``step_start``, ``tool_use``, ``text``, ``step_finish``, ``error``); the exit
status is 1 on any unrecoverable error, with the server's message in an ``error`` event. OpenCode's
own retries (5, on 429/5xx/connection errors) are hard-coded: ``HarnessOptions.retries`` cannot turn
them off, so a recorder that wants a run to stop answers with a 4xx.
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

#: The plugin OpenCode would otherwise install from the npm registry on first start.
_PLUGIN = "@opencode-ai/plugin"


def config_dir(setup: HarnessSetup) -> str:
    return posixpath.join(setup.home, ".config", "opencode")


def provider_options(setup: HarnessSetup) -> dict[str, Any]:
    """The ``@ai-sdk/openai-compatible`` provider's options for the recorder (OpenCode's config, and that
    of CLIs built on it): the key only named (``{env:...}``), both timeouts the agent's request timeout."""
    timeout_ms = int(setup.options.request_timeout_s * 1000)
    out: dict[str, Any] = {
        "baseURL": setup.base_url,
        "apiKey": "{env:" + API_KEY_ENV + "}",
        "headerTimeout": timeout_ms,
        "chunkTimeout": timeout_ms,
    }
    if setup.endpoint.extra_headers:
        out["headers"] = dict(setup.endpoint.extra_headers)
    return out


def _config(setup: HarnessSetup) -> dict[str, Any]:
    options = setup.options
    config: dict[str, Any] = {
        "$schema": "https://opencode.ai/config.json",
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
                        # OpenCode sends max_tokens = output and compacts at context - output.
                        "limit": {"context": setup.context_window, "output": setup.max_output_tokens},
                    }
                },
            }
        },
        "model": f"{PROVIDER_ID}/{setup.model}",
        "small_model": f"{PROVIDER_ID}/{setup.model}",
        "autoupdate": False,
        "share": "disabled",
        # No git shadow copy of the task's directory under the data dir.
        "snapshot": False,
        "agent": {"title": {"disable": not options.title_call}},
        "compaction": {"auto": options.compaction},
    }
    if not options.webfetch:
        config["tools"] = {"webfetch": False}
    return deep_merge(config, options.config_overrides)


def opencode_files(setup: HarnessSetup) -> dict[str, str]:
    root = config_dir(setup)
    plugin_deps = {"dependencies": {_PLUGIN: "*"}}
    return {
        posixpath.join(root, "opencode.json"): json.dumps(_config(setup), indent=2) + "\n",
        # The three markers that make OpenCode consider its plugin already installed.
        posixpath.join(root, "package.json"): json.dumps(plugin_deps) + "\n",
        posixpath.join(root, "package-lock.json"): json.dumps({"packages": {"": plugin_deps}}) + "\n",
        posixpath.join(root, "node_modules", ".keep"): "",
    }


def opencode_env(setup: HarnessSetup) -> dict[str, str]:
    return {}


def opencode_command(setup: HarnessSetup, prompt: str, executable: str) -> tuple[list[str], str | None]:
    argv = [executable, "run", "--format", "json", "-m", f"{PROVIDER_ID}/{setup.model}", *setup.options.extra_args]
    return argv, prompt


def _error_message(event: dict[str, Any]) -> str:
    error = event.get("error") or {}
    data = error.get("data") if isinstance(error, dict) else None
    message = data.get("message") if isinstance(data, dict) else None
    status = data.get("statusCode") if isinstance(data, dict) else None
    name = error.get("name") if isinstance(error, dict) else None
    text = str(message or name or error or "unknown error")
    return f"{status} {text}" if status else text


def parse_run_events(cli: str, exit_code: int | None, stdout: str, stderr: str) -> HarnessResult:
    """Exit status and final answer of ``<cli> run --format json`` (OpenCode's event stream, which CLIs
    built on OpenCode print too); ``cli`` names the program in the errors.

    The final answer is the text of the last step (everything after the last ``step_start``).
    """
    events = parse_jsonl(stdout)
    tool_calls: list[dict[str, Any]] = []
    answer_parts: list[str] = []
    errors: list[str] = []
    for event in events:
        kind = event.get("type")
        part = event.get("part") or {}
        if kind == "step_start":
            answer_parts = []
        elif kind == "text":
            answer_parts.append(str(part.get("text", "")))
        elif kind == "tool_use":
            state = part.get("state") or {}
            call = {"id": part.get("callID"), "name": part.get("tool"), "input": state.get("input")}
            tool_calls.append({**call, "status": state.get("status")})
        elif kind == "error":
            errors.append(_error_message(event))
    if exit_code == 0 and not errors:
        return HarnessResult(
            ok=True, exit_code=0, process_exit_code=0, final_answer="".join(answer_parts), tool_calls=tool_calls
        )
    if exit_code is None:
        reason = f"{cli} did not exit (killed or timed out)"
    else:
        reason = errors[-1] if errors else last_stderr_line(stderr) or f"{cli} exited with status {exit_code}"
    return HarnessResult(
        ok=False,
        exit_code=exit_code if exit_code else 1,
        process_exit_code=exit_code,
        final_answer=None,
        error=reason,
        tool_calls=tool_calls,
    )


def parse_opencode_output(exit_code: int | None, stdout: str, stderr: str) -> HarnessResult:
    """Exit status and final answer of ``opencode run --format json``."""
    return parse_run_events("opencode", exit_code, stdout, stderr)


OPENCODE = HarnessPreset(
    name="opencode",
    npm_package="opencode-ai",
    version="1.18.33",
    bin_name="opencode",
    binary="node_modules/.bin/opencode",
    aux_rules=(
        AuxRule(
            name="opencode-title",
            when=AuxCondition(no_tools=True, system_prompt_startswith="You are a title generator"),
        ),
        AuxRule(
            name="opencode-compaction",
            when=AuxCondition(no_tools=True, system_prompt_startswith="You are a context summarization agent"),
        ),
    ),
    offline_env={
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1",
        "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
        "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
    },
    files=opencode_files,
    env=opencode_env,
    command=opencode_command,
    parse=parse_opencode_output,
    # With install scripts off, bin/opencode.exe is a stub that only says so; the postinstall links
    # the platform binary in its place.
    postinstall=("node", "node_modules/opencode-ai/postinstall.mjs"),
    recommends=("rg",),
)
