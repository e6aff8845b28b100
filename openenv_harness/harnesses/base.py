"""What a harness preset is: everything needed to run one unmodified agent CLI against the recorder.

Why a declarative preset rather than a launcher class per agent: the rollout layer, the installer,
the doctor and the recorder's classifier all need different slices of the same facts (which npm
package, which config files, which environment keeps it offline, how to read its exit, which of its
calls are bookkeeping). Keeping those facts as data plus a few pure functions means a new agent is
one new preset module and one registry entry, and every fact can be tested without a process.

A preset never talks to the sandbox or the recorder itself. ``HarnessPreset.prepare`` turns a
``HarnessSetup`` (endpoint, model, limits, sandbox paths, options) and a prompt into a
``LaunchSpec``: files to place, environment, argv, stdin. The caller places and runs them; the
files' sha256 go into each record's provenance (D11). No secret is ever written into a file: the
API key travels in the environment only, under ``API_KEY_ENV``.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from openenv_harness.sandbox.base import ModelEndpoint

#: The environment variable that carries the per-rollout API key into the agent process. Config
#: files only *name* it, so they stay secret-free and their hashes stay stable across rollouts.
API_KEY_ENV = "OPENENV_HARNESS_API_KEY"

#: The provider name both presets register for the recorder endpoint.
PROVIDER_ID = "rollout"


class AuxCondition(BaseModel):
    """When a call is aux: every condition given here must hold (at least one text marker is given).

    The markers are read from the chat body the recorder runs on -- for Codex and Claude Code, the
    translation of their Responses / Messages request (``recorder/dialects``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    no_tools: bool = Field(default=True, description="The request carries no tools")
    system_prompt_startswith: str | None = Field(
        default=None, min_length=1, description="Opening words of the first system prompt")
    system_prompt_contains: str | None = Field(
        default=None, min_length=1, description="Words somewhere in the first system prompt")
    last_user_message_startswith: str | None = Field(
        default=None, min_length=1, description="Opening words of the last user message")

    @model_validator(mode="after")
    def _one_marker(self) -> "AuxCondition":
        if not (self.system_prompt_startswith or self.system_prompt_contains or self.last_user_message_startswith):
            raise ValueError("an aux condition needs a system-prompt or last-user-message marker")
        return self


class AuxRule(BaseModel):
    """A named marker of a non-policy call (title, compaction) the agent makes on its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    when: AuxCondition

    def as_data(self) -> dict[str, Any]:
        """``{name, when: {no_tools, <markers>}}``, the shape rule lists are shared in."""
        return self.model_dump(exclude_none=True)

    def as_flat(self) -> dict[str, Any]:
        """``{name, no_tools, <markers>}``, the flat shape the recorder's sessions take."""
        return {"name": self.name, **self.when.model_dump(exclude_none=True)}

    def matches(self, body: Mapping[str, Any]) -> bool:
        """Whether a chat request body is this kind of aux call."""
        when = self.when
        if when.no_tools and bool(body.get("tools")):
            return False
        prompt = first_system_prompt(body)
        if when.system_prompt_startswith is not None and not prompt.startswith(when.system_prompt_startswith):
            return False
        if when.system_prompt_contains is not None and when.system_prompt_contains not in prompt:
            return False
        return when.last_user_message_startswith is None or last_user_message(body).startswith(
            when.last_user_message_startswith)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


def last_user_message(body: Mapping[str, Any]) -> str:
    """Text of the last user message of a chat body ('' when it has none)."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, Mapping) and message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def first_system_prompt(body: Mapping[str, Any]) -> str:
    """Text of the leading system/developer message of a chat body ('' when it has none)."""
    messages = body.get("messages") or []
    if not messages or not isinstance(messages[0], Mapping):
        return ""
    first = messages[0]
    if first.get("role") not in ("system", "developer"):
        return ""
    content = first.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


class HarnessOptions(BaseModel):
    """User choices about one agent run. Defaults are what training wants.

    Every call an agent makes on its own (a title, a compaction summary) is a call the trainer did
    not ask for and must not train on; web access breaks offline runs. So those start off, and each
    can be turned back on explicitly. Retries are safe (the recorder de-duplicates a retried call)
    and start on where a network path of the agent's own can drop a call (``retries``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    title_call: bool = Field(default=False, description="OpenCode: let it make its session-title call")
    compaction: bool = Field(default=False, description="Let the agent summarize its context when it fills up")
    webfetch: bool = Field(default=False, description="OpenCode: keep its web-fetch tool")
    retries: bool | None = Field(
        default=None,
        description="Pi: let it retry failed model calls. None (default): on where the agent reaches the recorder "
        "over a path of its own (a remote sandbox's relay), off locally -- a retry is byte-identical, so the "
        "recorder answers it from the first attempt's record, never with a second sample")
    reasoning: bool = Field(default=False, description="Declare the model a reasoning model to the agent")
    request_timeout_s: float = Field(default=600.0, gt=0, description="How long the agent waits on one model call")
    extra_args: tuple[str, ...] = Field(default=(), description="Appended to the agent's command line")
    system_prompt_suffix: str | None = Field(
        default=None, description="Appended to the agent's own system prompt through its own flag (Pi, Claude Code: "
        "--append-system-prompt); an agent without such a flag refuses it")
    system_prompt: str | None = Field(
        default=None, min_length=1, description="Replaces the agent's own system prompt where it has a way (Pi, "
        "Claude Code: --system-prompt; Gemini CLI: a file named by GEMINI_SYSTEM_MD); an agent without one refuses it")
    extra_env: dict[str, str] = Field(default_factory=dict, description="Added to the agent's environment last")
    config_overrides: dict[str, Any] = Field(
        default_factory=dict, description="Deep-merged into the agent's main config file"
    )


@dataclass(frozen=True)
class HarnessSetup:
    """Everything a preset needs to configure one agent run inside one sandbox."""

    endpoint: ModelEndpoint
    model: str
    workdir: str
    home: str
    context_window: int = 32768
    max_output_tokens: int = 4096
    options: HarnessOptions = field(default_factory=HarnessOptions)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("HarnessSetup.model must be a non-empty model id")
        if not self.endpoint.base_url.startswith(("http://", "https://")):
            raise ValueError(f"HarnessSetup.endpoint.base_url must be an http(s) URL, got {self.endpoint.base_url!r}")
        for label, path in (("workdir", self.workdir), ("home", self.home)):
            if not posixpath.isabs(path):
                raise ValueError(f"HarnessSetup.{label} must be an absolute path inside the sandbox, got {path!r}")
        if self.max_output_tokens <= 0 or self.context_window <= 0:
            raise ValueError("HarnessSetup limits must be positive")
        if self.max_output_tokens >= self.context_window:
            raise ValueError(
                f"max_output_tokens ({self.max_output_tokens}) must be below context_window ({self.context_window})"
            )

    @property
    def base_url(self) -> str:
        """The endpoint base URL without a trailing slash (agents append ``/chat/completions``)."""
        return self.endpoint.base_url.rstrip("/")


@dataclass(frozen=True)
class LaunchSpec:
    """One agent run, ready to place and start: files, environment, argv, stdin, cwd."""

    argv: list[str]
    env: dict[str, str]
    files: dict[str, str]
    cwd: str
    #: Text to feed on stdin; ``None`` means stdin is empty (/dev/null), never an inherited pipe.
    stdin: str | None = None

    def config_hashes(self) -> dict[str, str]:
        """sha256 of every placed file, keyed by its sandbox path (provenance, D11)."""
        return {
            path: hashlib.sha256(content.encode("utf-8")).hexdigest() for path, content in sorted(self.files.items())
        }

    def redacted_env(self) -> dict[str, str]:
        """The environment with the API key masked, safe for logs and reports."""
        return {k: ("<redacted>" if k == API_KEY_ENV else v) for k, v in self.env.items()}


@dataclass(frozen=True)
class HarnessResult:
    """How an agent run ended, read from its exit status and output."""

    ok: bool
    #: 0 when the run succeeded, else non-zero -- even when the process itself exited 0 on an error.
    exit_code: int
    process_exit_code: int | None
    final_answer: str | None
    error: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


FilesBuilder = Callable[[HarnessSetup], dict[str, str]]
EnvBuilder = Callable[[HarnessSetup], dict[str, str]]
CommandBuilder = Callable[[HarnessSetup, str, str], tuple[list[str], str | None]]
OutputParser = Callable[[int | None, str, str], HarnessResult]


@dataclass(frozen=True)
class HarnessPreset:
    """Declarative description of one agent CLI."""

    name: str
    #: The npm package of a Node agent; empty for a Python agent (``pip_package``).
    npm_package: str
    version: str
    #: Executable name the package puts on ``node_modules/.bin`` (a Python agent's: on ``venvs/.bin``).
    bin_name: str
    #: Path of the executable relative to the node prefix it is installed in.
    binary: str
    #: Data the recorder's classifier consumes; see ``AuxRule``.
    aux_rules: tuple[AuxRule, ...]
    #: Static variables that keep the agent from reaching anything but the recorder.
    offline_env: Mapping[str, str]
    files: FilesBuilder
    env: EnvBuilder
    #: ``(setup, prompt, executable) -> (argv, stdin)``.
    command: CommandBuilder
    parse: OutputParser
    #: Run in the node prefix (argv) when the freshly installed binary does not answer ``--version``.
    postinstall: tuple[str, ...] = ()
    version_argv: tuple[str, ...] = ("--version",)
    #: What ``version_argv`` prints for the pinned version, where the CLI reports something other
    #: than its package's version (a hard-coded string); the package's own version stays the pin.
    reported_version: str | None = None
    #: Programs that must be on PATH for the CLI to start at all.
    requires: tuple[str, ...] = ()
    #: Programs the agent's tools use and would otherwise try to download.
    recommends: tuple[str, ...] = ()
    #: The agent's shell tool as ``(tool name, command argument)``: how a scripted ``bash`` call
    #: of the built-in tasks is written for this agent (``rollout.taskset.script_for``).
    shell_tool: tuple[str, str] = ("bash", "command")
    #: ``(pattern, replacement)`` rewrites (``re.sub``, in order) of the scripted shell commands of the
    #: built-in tasks, for an agent whose shell tool runs a command form as something other than a
    #: shell command (Qwen Code turns a bare ``sed -i`` into an edit of its own). Empty for most agents.
    shell_rewrites: tuple[tuple[str, str], ...] = ()
    #: The API the agent speaks to the recorder (``chat``, ``responses``, ``anthropic``).
    dialect: str = "chat"
    #: The CLI's own flag that appends text to its system prompt (``HarnessOptions.system_prompt_suffix``)
    append_system_prompt_flag: str | None = None
    #: The PyPI distribution of a Python agent, installed pinned into a venv of its own
    #: (``venvs/<name>`` in the node prefix); ``npm_package`` is then empty.
    pip_package: str | None = None
    #: What answers the install's version probe: the binary itself, or -- for a Python CLI without a
    #: version flag -- the interpreter of its venv (``version_argv`` then follows ``python``).
    version_probe: Literal["binary", "interpreter"] = "binary"
    #: The shell command that ends the agent's run (an agent that stops only on it): the built-in
    #: tasks' scripted final answer also runs it (``rollout.taskset.script_for``).
    submit_command: str | None = None

    def __post_init__(self) -> None:
        if bool(self.npm_package) == bool(self.pip_package):
            raise ValueError(f"{self.name}: a preset names exactly one of npm_package and pip_package")

    #: The CLI's own flag that replaces its system prompt (``HarnessOptions.system_prompt``)
    system_prompt_flag: str | None = None
    #: Or the environment variable that names a file the CLI reads its system prompt from instead
    system_prompt_file_env: str | None = None

    @property
    def version_output(self) -> str:
        """The text ``version_argv`` prints when the pinned version is installed."""
        return self.reported_version or self.version

    @property
    def npm_spec(self) -> str:
        """``package@version``, pinned exactly."""
        return f"{self.npm_package}@{self.version}"

    @property
    def install_spec(self) -> str:
        """What the installer installs, pinned exactly: ``package==version`` (PyPI) or ``npm_spec``."""
        return f"{self.pip_package}=={self.version}" if self.pip_package else self.npm_spec

    def aux_rules_data(self) -> list[dict[str, Any]]:
        return [rule.as_data() for rule in self.aux_rules]

    def prepare(self, setup: HarnessSetup, prompt: str, executable: str | None = None) -> LaunchSpec:
        """The files, environment and command of one headless run of ``prompt``."""
        if not prompt:
            raise ValueError(f"{self.name}: the prompt must be non-empty")
        argv, stdin = self.command(setup, prompt, executable or self.bin_name)
        suffix = setup.options.system_prompt_suffix
        if suffix:
            if self.append_system_prompt_flag is None:
                raise ValueError(f"{self.name} has no flag that appends to its system prompt: "
                                 "system_prompt_suffix applies to agents that have one (pi, claude-code)")
            argv = [argv[0], self.append_system_prompt_flag, suffix, *argv[1:]]
        files = self.files(setup)
        prompt_env: dict[str, str] = {}
        replaced = setup.options.system_prompt
        if replaced:
            if self.system_prompt_flag is not None:
                argv = [argv[0], self.system_prompt_flag, replaced, *argv[1:]]
            elif self.system_prompt_file_env is not None:
                path = posixpath.join(setup.home, ".openenv-harness", "system-prompt.md")
                files = {**files, path: replaced}
                prompt_env[self.system_prompt_file_env] = path
            else:
                raise ValueError(f"{self.name} has no way to replace its system prompt: system_prompt applies to "
                                 "agents that have one (pi, claude-code, gemini-cli)")
        env = {
            **home_env(setup.home),
            **dict(self.offline_env),
            API_KEY_ENV: setup.endpoint.api_key,
            **self.env(setup),
            **prompt_env,
            **setup.options.extra_env,
        }
        return LaunchSpec(argv=argv, env=env, files=files, cwd=setup.workdir, stdin=stdin)

    def parse_output(self, exit_code: int | None, stdout: str, stderr: str) -> HarnessResult:
        """Read the exit status and final answer of a finished run."""
        return self.parse(exit_code, stdout, stderr)


def home_env(home: str) -> dict[str, str]:
    """HOME and the XDG directories, all inside the sandbox's private home.

    Set by the preset as well as the sandbox, because an agent that finds no XDG variables falls back
    to the real user's directories on a remote machine whose sandbox did not set them.
    """
    return {
        "HOME": home,
        "XDG_CONFIG_HOME": posixpath.join(home, ".config"),
        "XDG_DATA_HOME": posixpath.join(home, ".local", "share"),
        "XDG_CACHE_HOME": posixpath.join(home, ".cache"),
        "XDG_STATE_HOME": posixpath.join(home, ".local", "state"),
    }


def deep_merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with ``overrides`` merged in; nested dicts merge, everything else replaces."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines stream; lines that are not JSON objects are skipped."""
    events: list[dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def last_stderr_line(stderr: str) -> str | None:
    """The last non-empty stderr line, which is where both CLIs put their error message."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else None
