"""The mini-swe-agent preset (PyPI ``mini-swe-agent``), a Python CLI: LiteLLM under a 100-line agent loop.

Installed by the installer into a venv of its own (``pip_package``), its ``mini`` executable linked
into ``venvs/.bin``. One task runs headless with ``mini -y --exit-immediately -l 0 -c mini.yaml -c
<ours> -t <prompt>``: ``-y`` (yolo) runs the model's commands without asking, ``--exit-immediately`` ends
the run when the agent submits instead of asking for a new task, ``-l 0`` lifts its dollar limit
(the recorder's budgets bound a run), and ``MSWEA_CONFIGURED`` skips the first-run wizard (a
prompt on the terminal).

How it reaches the recorder (read in ``minisweagent/models/litellm_model.py`` of 2.4.6): the default
model class calls ``litellm.completion(model=..., messages=..., tools=[BASH_TOOL], **model_kwargs)``,
so the model is ``openai/<model>`` (LiteLLM's OpenAI-compatible provider; the prefix is stripped on
the wire) with ``api_base`` in ``model_kwargs``, and the key is LiteLLM's ``OPENAI_API_KEY`` from the
environment. Our config file (``$HOME/.config/mini-swe-agent/openenv-harness.yaml``, written as
JSON, which YAML reads) names the URL, never the key; it is merged over the package's own
``mini.yaml`` (the system and instance prompts, which we do not copy).

It acts by native tool calls: one ``bash`` tool with a ``command`` argument, each answered by a
``tool`` message. A reply without a tool call is a format error it answers with a user message
(three in a row end the run), so it never ends on plain text: it ends when a command's output
starts with ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` (``submit_command``), and the built-in tasks'
scripted final answer runs that command too.

Kept on the machine and in the sandbox home: ``MSWEA_GLOBAL_CONFIG_DIR`` (its ``.env`` and
trajectory) and ``MSWEA_CONFIG_DIR`` point into the sandbox home; LiteLLM's cost map is its bundled
copy (``LITELLM_LOCAL_MODEL_COST_MAP``, ``LITELLM_OFFLINE_MODE``), and cost tracking ignores the
unknown model (``cost_tracking: ignore_errors``) instead of failing the call. Its own retries
(tenacity, 10 attempts 4-60 s apart, on everything but a few 4xx -- a budget stop's 400 included)
are cut to one attempt, or three where ``retries`` is on.

The command is ``sh -c`` around ``mini``, for two reasons. ``-c mini.yaml`` is looked up in the
process's directory before the package's own, so ``mini`` starts in its config directory (a task's
own ``mini.yaml`` must not replace the agent's prompts; the commands still run in the task directory,
``environment.cwd``). And its console transcript is rich text wrapped at 80 columns, with no
machine-readable form and exit status 0 on a repeated format error; the trajectory it saves is
exact, so the wrapper prints it after ``MARKER`` and keeps ``mini``'s exit status: an uncaught error
(the recorder's 400 at a budget stop) is a traceback and exit 1, the trajectory's ``exit_status``
says the rest (``Submitted`` is success).
"""

from __future__ import annotations

import json
import posixpath
import shlex
from typing import Any

from openenv_harness.harnesses.base import (
    HarnessPreset,
    HarnessResult,
    HarnessSetup,
    deep_merge,
    last_stderr_line,
)

#: The command whose output ends a run (``LocalEnvironment._check_finished``).
SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
CONFIG_NAME = "openenv-harness.yaml"
TRAJECTORY_NAME = "trajectory.json"
#: The line the launch command prints between mini's console transcript and its trajectory.
MARKER = "=== openenv-harness: mini-swe-agent trajectory ==="


def config_dir(setup: HarnessSetup) -> str:
    return posixpath.join(setup.home, ".config", "mini-swe-agent")


def _config(setup: HarnessSetup) -> dict[str, Any]:
    options = setup.options
    model_kwargs: dict[str, Any] = {
        "api_base": setup.base_url,
        "max_tokens": setup.max_output_tokens,
        "timeout": options.request_timeout_s,
        "drop_params": True,
    }
    if setup.endpoint.extra_headers:
        model_kwargs["extra_headers"] = dict(setup.endpoint.extra_headers)
    config: dict[str, Any] = {
        "agent": {"step_limit": 0, "cost_limit": 0},
        "model": {
            "model_class": "litellm",
            "model_name": f"openai/{setup.model}",
            "cost_tracking": "ignore_errors",
            "model_kwargs": model_kwargs,
        },
        "environment": {"environment_class": "local", "cwd": setup.workdir},
    }
    return deep_merge(config, options.config_overrides)


def mini_files(setup: HarnessSetup) -> dict[str, str]:
    return {posixpath.join(config_dir(setup), CONFIG_NAME): json.dumps(_config(setup), indent=2) + "\n"}


def mini_env(setup: HarnessSetup) -> dict[str, str]:
    env = {
        "MSWEA_GLOBAL_CONFIG_DIR": config_dir(setup),
        "MSWEA_CONFIG_DIR": config_dir(setup),
        "OPENAI_API_KEY": setup.endpoint.api_key,
    }
    # tenacity retries every error but a few 4xx -- a budget stop's 400 too -- 4 to 60 s apart: one
    # attempt, or three (4 and 8 s later) where retries are on, never its minutes-long default of 10
    env["MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT"] = "3" if setup.options.retries else "1"
    return env


def mini_command(setup: HarnessSetup, prompt: str, executable: str) -> tuple[list[str], str | None]:
    """``sh -c`` around ``mini``: run from its config directory, then print the trajectory after ``MARKER``."""
    directory = config_dir(setup)
    trajectory = posixpath.join(directory, TRAJECTORY_NAME)
    script = (f"cd {shlex.quote(directory)} || exit 126; rm -f {shlex.quote(trajectory)}; "
              '"$0" "$@"; status=$?; '
              f"printf '\\n%s\\n' {shlex.quote(MARKER)}; cat {shlex.quote(trajectory)} 2>/dev/null; exit $status")
    argv = [executable, "-y", "--exit-immediately", "-l", "0",
            "-c", "mini.yaml", "-c", posixpath.join(directory, CONFIG_NAME), "-o", trajectory,
            *setup.options.extra_args, "-t", prompt]
    return ["sh", "-c", script, *argv], None


def _trajectory(stdout: str) -> dict[str, Any] | None:
    _, found, tail = stdout.rpartition(MARKER + "\n")
    if not found:
        return None
    try:
        data = json.loads(tail)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _tool_calls(messages: list[Any]) -> list[dict[str, Any]]:
    calls = []
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            arguments = function.get("arguments")
            try:
                parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
            except ValueError:
                parsed = arguments
            calls.append({"id": call.get("id"), "name": function.get("name"), "input": parsed})
    return calls


def parse_mini_output(exit_code: int | None, stdout: str, stderr: str) -> HarnessResult:
    """Exit status and final answer of one run, read from the trajectory printed after ``MARKER``.

    Success is mini's own ``exit_status`` ``Submitted`` (it exits 0 on a repeated format error too).
    The final answer is the submission (what the submit command printed after its marker line) when
    there is one, else the text of the agent's last reply."""
    trajectory = _trajectory(stdout) or {}
    messages = [m for m in trajectory.get("messages") or [] if isinstance(m, dict)]
    info = trajectory.get("info") if isinstance(trajectory.get("info"), dict) else {}
    status = info.get("exit_status")
    tool_calls = _tool_calls(messages)
    exit_message = next((_content_text(m.get("content")) for m in reversed(messages) if m.get("role") == "exit"), "")
    if exit_code is None:
        error = "mini did not exit (killed or timed out)"
    elif exit_code != 0:
        error = last_stderr_line(stderr) or exit_message or f"mini exited with status {exit_code}"
    elif not trajectory:
        error = last_stderr_line(stderr) or "mini left no trajectory"
    elif status != "Submitted":
        error = f"mini ended with {status or 'no exit status'}" + (f": {exit_message}" if exit_message != status else "")
    else:
        submission = str(info.get("submission") or "").strip()
        last = next((m for m in reversed(messages) if m.get("role") == "assistant"), {})
        answer = submission or _content_text(last.get("content")).strip()
        return HarnessResult(ok=True, exit_code=0, process_exit_code=0, final_answer=answer, tool_calls=tool_calls)
    return HarnessResult(ok=False, exit_code=exit_code if exit_code else 1, process_exit_code=exit_code,
                         final_answer=None, error=error, tool_calls=tool_calls)


MINI_SWE_AGENT = HarnessPreset(
    name="mini-swe-agent",
    npm_package="",
    pip_package="mini-swe-agent",
    version="2.4.6",
    bin_name="mini",
    binary="venvs/mini-swe-agent/bin/mini",
    # It makes no call of its own: every call carries its bash tool.
    aux_rules=(),
    offline_env={
        "MSWEA_CONFIGURED": "true",
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_OFFLINE_MODE": "true",
        "PAGER": "cat",
    },
    files=mini_files,
    env=mini_env,
    command=mini_command,
    parse=parse_mini_output,
    # ``mini`` has no version flag: its venv's interpreter imports the CLI and says the version.
    version_probe="interpreter",
    version_argv=("-c", "import minisweagent.run.mini, minisweagent; print(minisweagent.__version__)"),
    submit_command=SUBMIT_COMMAND,
    dialect="chat",
)
