"""The Qwen Code preset (``@qwen-code/qwen-code``), which speaks OpenAI chat completions.

Qwen Code reads ``$QWEN_HOME/settings.json`` (default ``~/.qwen``; the preset sets ``QWEN_HOME`` inside
the sandbox's home). The recorder is declared there as its one ``modelProviders.openai`` model: ``id``
is the model name it sends, ``baseUrl`` the session's ``/v1`` base (its OpenAI SDK appends
``/chat/completions``), and ``envKey`` *names* ``API_KEY_ENV``, the variable it reads the key from at
run time -- the file holds no key. ``security.auth.selectedType: openai`` and ``model.name`` select that
model, so no ``OPENAI_*`` variable is needed. One task runs headless with ``qwen --output-format stream-json --approval-mode yolo
--prompt <task>``.

Kept offline and free of calls of its own: usage statistics, telemetry and the update check are off;
``web_fetch``/``web_search`` are excluded unless web access is asked for; the next-speaker check and
loop detection (tool-less calls of the CLI's own) stay skipped; managed auto-memory, its "dream" and
auto-skill reviews (background side queries) are off; its session-title and tool-use-summary calls
need a fast model, which is never set. ``enableCacheControl: false`` keeps a compaction on its
dedicated summarizer -- a tool-less call under Qwen Code's compression prompt, classified
``qwen-code-compression`` -- rather than a cache-sharing request that replays the conversation with
its tools. Qwen Code cannot turn compaction off: with ``compaction`` off its trigger is pushed to the
ceiling (``context.autoCompactThreshold: 1``: the window itself up to a 33k-token window, else 33k
tokens below it, its 20k summary reserve plus a 13k buffer), and its clearing of old tool results (a
history rewrite of its own) is off. It sends ``max_tokens`` as the preset's output limit, lowered to
what the window leaves after the prompt and a 10k margin, but never below 4000.

Output: JSON lines -- ``system`` (``init``), ``assistant`` (``message.content``: ``text`` and
``tool_use`` blocks), ``user`` (``tool_result`` blocks), ``stream_event``, and a final ``result``
(``subtype``, ``is_error``, ``result``, ``error.message``); the exit status is 1 on an API error.

The scripted reference solutions (``rollout.taskset``) read a file with ``cat`` and fix it with
``sed -i 's/a/b/' FILE``. Qwen Code's shell tool runs such a bare in-place sed as an edit of its own
(``ShellToolInvocation.getSedEditInfo`` / ``parseSedEditCommand``, packages/core/src/tools/shell.ts
and utils/sedEditParser.ts in 0.24.4), and that edit refuses a file its ``read_file`` tool has not
read in the session (``checkSedPriorRead`` -> ``checkPriorRead``, tools/priorReadEnforcement.ts: "has
not been read in this session"). No setting, variable or approval mode lifts the check: it is skipped
only under ``fileReadCacheDisabled``, which the CLI's config loader never sets, and ``read_file``
takes only absolute paths, which a script written before the sandbox exists cannot know. So
``shell_rewrites`` writes the scripted sed with an end-of-options ``--``: the parser takes no option
it does not know and hands the command to the shell, where the same GNU sed makes the same edit.
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

#: Opening words of Qwen Code's compression prompt (``getCompressionPrompt`` in 0.24.4).
COMPRESSION_MARKER = "You are the component that summarizes a conversation when its context window is about to overflow"
#: Qwen Code's tools that reach the web.
WEB_TOOLS = ("web_fetch", "web_search")


def qwen_home(setup: HarnessSetup) -> str:
    return posixpath.join(setup.home, ".qwen")


def _provider(setup: HarnessSetup) -> dict[str, Any]:
    options = setup.options
    generation: dict[str, Any] = {
        "contextWindowSize": setup.context_window,
        "samplingParams": {"max_tokens": setup.max_output_tokens},
        "timeout": int(options.request_timeout_s * 1000),
        "enableCacheControl": False,
    }
    if not options.retries:
        generation["maxRetries"] = 0
    if setup.endpoint.extra_headers:
        generation["customHeaders"] = dict(setup.endpoint.extra_headers)
    return {"id": setup.model, "name": setup.model, "baseUrl": setup.base_url, "envKey": API_KEY_ENV,
            "generationConfig": generation}


def _settings(setup: HarnessSetup) -> dict[str, Any]:
    options = setup.options
    context: dict[str, Any] = {}
    if not options.compaction:
        context = {"autoCompactThreshold": 1,
                   "clearContextOnIdle": {"toolResultsThresholdMinutes": -1, "toolResultsTotalCharsThreshold": -1}}
    settings: dict[str, Any] = {
        "security": {"auth": {"selectedType": "openai"}},
        "modelProviders": {"openai": [_provider(setup)]},
        "model": {"name": setup.model, "skipNextSpeakerCheck": True, "skipLoopDetection": True},
        "context": context,
        "memory": {"enableManagedAutoMemory": False, "enableManagedAutoDream": False, "enableAutoSkill": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False, "logPrompts": False},
        "general": {"enableAutoUpdate": False, "preventSystemSleep": False},
        "experimental": {"emitToolUseSummaries": False},
    }
    if not options.webfetch:
        settings["tools"] = {"exclude": list(WEB_TOOLS)}
    return deep_merge(settings, options.config_overrides)


def qwen_files(setup: HarnessSetup) -> dict[str, str]:
    return {posixpath.join(qwen_home(setup), "settings.json"): json.dumps(_settings(setup), indent=2) + "\n"}


def qwen_env(setup: HarnessSetup) -> dict[str, str]:
    return {"QWEN_HOME": qwen_home(setup)}


def qwen_command(setup: HarnessSetup, prompt: str, executable: str) -> tuple[list[str], str | None]:
    argv = [executable, "--output-format", "stream-json", "--approval-mode", "yolo", "--model", setup.model,
            *setup.options.extra_args, "--prompt", prompt]
    return argv, None


def _blocks(event: dict[str, Any]) -> list[dict[str, Any]]:
    message = event.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def parse_qwen_output(exit_code: int | None, stdout: str, stderr: str) -> HarnessResult:
    """Exit status and final answer of ``qwen --output-format stream-json`` (its ``result`` line)."""
    events = parse_jsonl(stdout)
    tool_calls = [{"id": b.get("id"), "name": b.get("name"), "input": b.get("input")}
                  for e in events if e.get("type") == "assistant" for b in _blocks(e) if b.get("type") == "tool_use"]
    results = [e for e in events if e.get("type") == "result"]
    result = results[-1] if results else None
    if exit_code is None:
        error = "qwen did not exit (killed or timed out)"
    elif result is None:
        error = last_stderr_line(stderr) or f"qwen exited with status {exit_code} and no result"
    elif exit_code != 0 or result.get("is_error") or result.get("subtype") != "success":
        detail = result.get("error")
        message = detail.get("message") if isinstance(detail, dict) else detail
        error = str(message or result.get("result") or last_stderr_line(stderr) or result.get("subtype") or "error")
    else:
        answer = result.get("result")
        return HarnessResult(ok=True, exit_code=0, process_exit_code=0,
                             final_answer=answer if isinstance(answer, str) else "", tool_calls=tool_calls)
    return HarnessResult(ok=False, exit_code=exit_code if exit_code else 1, process_exit_code=exit_code,
                         final_answer=None, error=error, tool_calls=tool_calls)


QWEN_CODE = HarnessPreset(
    name="qwen-code",
    npm_package="@qwen-code/qwen-code",
    version="0.24.4",
    bin_name="qwen",
    binary="node_modules/.bin/qwen",
    aux_rules=(
        # its compaction summary: a side query without tools under the compression prompt
        AuxRule(name="qwen-code-compression",
                when=AuxCondition(no_tools=True, system_prompt_contains=COMPRESSION_MARKER)),
    ),
    offline_env={
        "QWEN_CODE_NO_RELAUNCH": "true",
        "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
        "QWEN_CODE_DISABLE_PRECONNECT": "1",
    },
    files=qwen_files,
    env=qwen_env,
    command=qwen_command,
    parse=parse_qwen_output,
    shell_tool=("run_shell_command", "command"),
    # ``sed -i EXPR FILE`` -> ``sed -i -- EXPR FILE``: run by the shell, not as Qwen Code's own edit
    shell_rewrites=((r"^sed -i (?!--)", "sed -i -- "),),
    dialect="chat",
    append_system_prompt_flag="--append-system-prompt",
    system_prompt_flag="--system-prompt",
)
