"""The Codex preset (``@openai/codex``): OpenAI's coding agent, which speaks only the Responses API.

Codex reads ``$CODEX_HOME/config.toml``; the recorder is declared there as a model provider with
``wire_api = "responses"`` and ``base_url = <recorder>/rollout/<session>/v1`` (Codex appends
``/responses``). The key is named, never written: ``env_key`` points at the variable that carries it.
One task runs headless with ``codex exec --json`` and the prompt as the last argument after ``--``.

Offline by configuration (checked with strace: no connection but the recorder's): Codex's defaults
would run ``git ls-remote https://github.com/openai/plugins.git`` (plugins), check for updates,
send analytics and offer a hosted ``web_search`` tool and sub-agent, goal and image tools; the
config turns all of those off, as well as the shell snapshot (it can hang) and history files.
``--ephemeral`` keeps no session files.

Output: JSON lines -- ``thread.started``, ``turn.started``, ``item.started``/``item.completed``
(``agent_message`` with the answer, ``command_execution`` with the command and its output,
``reasoning``, and ``error`` items that are warnings, e.g. "Model metadata for X not found"),
``turn.completed``, and ``turn.failed`` / ``error`` when the run failed.

Replay (what the recorder sees next turn): Codex sends the function-call ``arguments`` and the
reasoning text back verbatim, and ``function_call_output`` items with its own framing of the
command's output ("Chunk ID ... Output:"). Nothing the model sampled is re-serialized.
"""

from __future__ import annotations

import json
import posixpath
import re
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

#: Codex features whose defaults reach the network or add tools a chat engine cannot run.
_FEATURES_OFF = ("shell_snapshot", "plugins", "remote_plugin", "apps", "goals", "image_generation", "tool_suggest",
                 "browser_use", "computer_use", "memories")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def codex_home(setup: HarnessSetup) -> str:
    return posixpath.join(setup.home, ".codex")


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON's string escapes are valid TOML basic strings
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to config.toml")


def to_toml(data: dict[str, Any], prefix: str = "") -> str:
    """A TOML document for nested dicts of scalars and lists (what Codex's config needs)."""
    lines = [f"{_key(k)} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict):
            name = f"{prefix}.{_key(k)}" if prefix else _key(k)
            lines.append("")
            lines.append(f"[{name}]")
            lines.append(to_toml(v, name).strip("\n"))
    return "\n".join(lines).strip("\n") + "\n"


def _config(setup: HarnessSetup) -> dict[str, Any]:
    options = setup.options
    provider: dict[str, Any] = {
        "name": "Rollout recorder",
        "base_url": setup.base_url,
        "env_key": API_KEY_ENV,
        "wire_api": "responses",
        "stream_idle_timeout_ms": int(options.request_timeout_s * 1000),
    }
    if not options.retries:
        provider["request_max_retries"] = 0
        provider["stream_max_retries"] = 0
    if setup.endpoint.extra_headers:
        provider["http_headers"] = dict(setup.endpoint.extra_headers)
    config: dict[str, Any] = {
        "model": setup.model,
        "model_provider": PROVIDER_ID,
        "model_context_window": setup.context_window,
        # Compaction summarizes at this many tokens; "off" is a limit no prompt reaches.
        "model_auto_compact_token_limit": (int(setup.context_window * 0.9) if options.compaction
                                           else 1_000_000_000),
        "approval_policy": "never",
        "sandbox_mode": "danger-full-access",
        "check_for_update_on_startup": False,
        "web_search": "live" if options.webfetch else "disabled",
        "analytics": {"enabled": False},
        "history": {"persistence": "none"},
        "agents": {"enabled": False},
        "features": {name: False for name in _FEATURES_OFF},
        "model_providers": {PROVIDER_ID: provider},
    }
    return deep_merge(config, options.config_overrides)


def codex_files(setup: HarnessSetup) -> dict[str, str]:
    return {posixpath.join(codex_home(setup), "config.toml"): to_toml(_config(setup))}


def codex_env(setup: HarnessSetup) -> dict[str, str]:
    return {"CODEX_HOME": codex_home(setup)}


def codex_command(setup: HarnessSetup, prompt: str, executable: str) -> tuple[list[str], str | None]:
    argv = [
        executable, "exec", "--json", "--ephemeral", "--color", "never",
        # the sandbox is the rollout's own; Codex's would need namespaces the sandbox may not have
        "--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check",
        "-m", setup.model, *setup.options.extra_args,
        "--", prompt,  # after "--" a prompt starting with "-" is still the prompt; stdin stays empty
    ]  # fmt: skip
    return argv, None


def _failure(exit_code: int | None, error: str, tool_calls: list[dict[str, Any]]) -> HarnessResult:
    return HarnessResult(ok=False, exit_code=exit_code if exit_code else 1, process_exit_code=exit_code,
                         final_answer=None, error=error, tool_calls=tool_calls)


def _error_text(event: dict[str, Any]) -> str:
    error = event.get("error")
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return str(event.get("message") or error or event.get("type"))


def parse_codex_output(exit_code: int | None, stdout: str, stderr: str) -> HarnessResult:
    """Exit status and final answer of ``codex exec --json`` (the last ``agent_message``)."""
    events = parse_jsonl(stdout)
    tool_calls: list[dict[str, Any]] = []
    answer: str | None = None
    errors: list[str] = []
    for event in events:
        kind = event.get("type")
        item = event.get("item") if isinstance(event.get("item"), dict) else {}
        if kind == "item.completed" and item.get("type") == "agent_message":
            answer = str(item.get("text", ""))
        elif kind == "item.completed" and item.get("type") == "command_execution":
            tool_calls.append({"id": item.get("id"), "name": "exec_command", "input": item.get("command"),
                               "status": item.get("status"), "exit_code": item.get("exit_code")})
        elif kind in ("turn.failed", "error"):
            errors.append(_error_text(event))
    if exit_code is None:
        return _failure(None, "codex did not exit (killed or timed out)", tool_calls)
    if exit_code != 0 or errors:
        reason = errors[-1] if errors else last_stderr_line(stderr) or f"codex exited with status {exit_code}"
        return _failure(exit_code, reason, tool_calls)
    if answer is None:
        return _failure(exit_code, "codex ended without an answer", tool_calls)
    return HarnessResult(ok=True, exit_code=0, process_exit_code=0, final_answer=answer, tool_calls=tool_calls)


CODEX = HarnessPreset(
    name="codex",
    npm_package="@openai/codex",
    version="0.171.0",
    bin_name="codex",
    binary="node_modules/.bin/codex",
    aux_rules=(
        # Captured (tests/data/harness_capture/codex/compact): a call without tools whose last user
        # message asks for a handoff summary, under the usual system prompt.
        AuxRule(name="codex-compaction",
                when=AuxCondition(no_tools=True,
                                  last_user_message_startswith="You are performing a CONTEXT CHECKPOINT COMPACTION")),
    ),
    offline_env={},
    files=codex_files,
    env=codex_env,
    command=codex_command,
    parse=parse_codex_output,
    # bin/codex.js ("#!/usr/bin/env node") starts the platform binary npm installed beside it.
    requires=("node",),
    shell_tool=("exec_command", "cmd"),
    dialect="responses",
)
