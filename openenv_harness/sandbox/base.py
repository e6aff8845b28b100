"""Where an agent runs: the sandbox interface every backend implements.

Why an interface this small: a harness only needs to place files, start one long-running command,
wait for it, read what it wrote and tear everything down. The local subprocess backend and the
Hugging Face backend differ in everything else -- and, for the agent, only in the base URL it is
given (``model_base_url``): locally the recorder's own URL, remotely a relay on the sandbox's
localhost that tunnels back to the trainer.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Mapping


class SandboxError(RuntimeError):
    """A sandbox operation failed; the message says which and why."""


@dataclass(frozen=True)
class CommandResult:
    """How a finished command ended."""

    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    duration_s: float = 0.0


@dataclass
class ModelEndpoint:
    """What the agent inside the sandbox is told about its model: a URL and a key, nothing else."""

    base_url: str
    api_key: str
    extra_headers: dict[str, str] = field(default_factory=dict)


class BackgroundProcess(abc.ABC):
    """A command started with ``Sandbox.start``; its output goes to files inside the sandbox."""

    @abc.abstractmethod
    def poll(self) -> int | None:
        """The exit code if the process has ended, else ``None``."""

    @abc.abstractmethod
    def wait(self, timeout_s: float | None = None) -> int | None:
        """Wait until it ends (``None`` if ``timeout_s`` passed first)."""

    @abc.abstractmethod
    def kill(self) -> None:
        """Kill the process and everything it started (its process group)."""

    @property
    @abc.abstractmethod
    def stdout_path(self) -> str:
        """Path of the captured stdout, inside the sandbox."""

    @property
    @abc.abstractmethod
    def stderr_path(self) -> str:
        """Path of the captured stderr, inside the sandbox."""


class Sandbox(abc.ABC):
    """One rollout's private place to run: a working directory, a HOME, and processes."""

    #: Absolute path of the task's working directory inside the sandbox.
    workdir: str
    #: Absolute path of the private HOME inside the sandbox.
    home: str
    #: Whether the agent reaches the recorder over a network path of its own (a relay, a tunnel):
    #: one that can drop a call the recorder never failed, so the agent should retry (``launch.py``).
    remote: bool = False

    def infrastructure_faults(self) -> list[str]:
        """What went wrong around the agent in this sandbox's life, for a person to read: a relay
        link that dropped, calls it cut. Non-empty keeps a rollout that did not finish unscored
        (``rollout/unscored.py``). A local sandbox has no path of its own to fail."""
        return []

    @abc.abstractmethod
    def start_sandbox(self) -> None:
        """Create the sandbox (directories, remote machine, ...). Idempotent."""

    @abc.abstractmethod
    def model_endpoint(self, recorder_base_url: str, api_key: str) -> ModelEndpoint:
        """The endpoint the agent inside must use to reach ``recorder_base_url``.

        Local sandboxes return it unchanged; remote ones return a localhost relay URL.
        """

    @abc.abstractmethod
    def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> None:
        """Write a file; relative paths are relative to ``workdir``. Parents are created."""

    @abc.abstractmethod
    def read_file(self, path: str) -> bytes:
        """Read a file; relative paths are relative to ``workdir``."""

    @abc.abstractmethod
    def run(
        self,
        cmd: list[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float | None = None,
        stdin: str | None = None,
    ) -> CommandResult:
        """Run a command to completion (used for setup and for ``verify()``)."""

    @abc.abstractmethod
    def start(
        self,
        cmd: list[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        name: str = "agent",
    ) -> BackgroundProcess:
        """Start a long-running command in the background, output captured to files."""

    @abc.abstractmethod
    def close(self) -> None:
        """Kill every process and release the sandbox. Safe to call twice."""

    def __enter__(self) -> "Sandbox":
        self.start_sandbox()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
