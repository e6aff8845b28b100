"""The container engine (Docker or podman) the container sandbox drives through its command line.

Why the command line and not an SDK: both engines take the same ``run``/``exec``/``import``
arguments, the CLI is what a person debugging a sandbox would type, and it adds no dependency.
Why a check that the engine *answers* and not only that its binary exists: ``docker`` installed
without a running daemon (or without permission on its socket) is the usual broken state, and it
should be named before a rollout starts, not discovered as a failed ``docker run`` in the middle.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

from openenv_harness.sandbox.base import SandboxError

EngineKind = Literal["docker", "podman"]

#: How to get a working engine, shown wherever none answers.
REMEDY = (
    "install Docker and start its daemon (Debian/Ubuntu, as root: `apt-get install docker.io`, then "
    "`systemctl start docker`, or `dockerd > /var/log/dockerd.log 2>&1 &` where there is no systemd; a "
    "non-root user also needs to be in the `docker` group), or install podman (`apt-get install podman`, "
    "no daemon needed) and use --sandbox podman"
)

_PROBE_TIMEOUT_S = 10.0
#: How much of a failed command's stderr an error message carries.
_STDERR_CHARS = 2000


def _kind_of(binary: str) -> EngineKind:
    return "podman" if "podman" in os.path.basename(binary) else "docker"


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


@dataclass(frozen=True)
class ContainerEngine:
    """One engine binary, and which command-line dialect it speaks."""

    binary: str
    kind: EngineKind

    def available(self) -> tuple[bool, str]:
        """Whether the engine answers: ``(True, server version)`` or ``(False, the reason in words)``."""
        # docker's version is the daemon's (so the call fails when no daemon answers); podman has no
        # daemon, and its ``info`` fails where its storage or user namespace is unusable
        fmt = "{{.Version.Version}}" if self.kind == "podman" else "{{.ServerVersion}}"
        name = os.path.basename(self.binary)
        try:
            done = subprocess.run([self.binary, "info", "--format", fmt], capture_output=True,
                                  timeout=_PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            return False, f"{name} is not installed"
        except subprocess.TimeoutExpired:
            return False, f"{name} is installed but `{name} info` did not answer in {_PROBE_TIMEOUT_S:.0f} s"
        except OSError as exc:
            return False, f"{self.binary} could not be run: {exc}"
        version = done.stdout.decode(errors="replace").strip()
        if done.returncode == 0 and version and "<no value>" not in version:
            return True, version
        why = _first_line(done.stderr.decode(errors="replace")) or f"exit code {done.returncode}, no version"
        what = "its daemon does not answer" if self.kind == "docker" else "it does not work"
        return False, f"{name} is installed but {what}: {why}"

    def run_cli(self, args: list[str], *, input: bytes | None = None, timeout_s: float | None = 60,
                check: bool = True) -> subprocess.CompletedProcess[bytes]:
        """Run ``<binary> *args``; with ``check``, a non-zero exit raises ``SandboxError`` carrying its stderr.

        A timeout or a binary that cannot be started raises ``SandboxError`` whatever ``check`` says:
        there is no exit status to hand back.
        """
        shown = " ".join([self.binary, *args[:2]])
        try:
            done = subprocess.run([self.binary, *args], input=input, capture_output=True, timeout=timeout_s,
                                  stdin=None if input is not None else subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise SandboxError(f"`{shown} ...` did not finish in {timeout_s} s") from exc
        except OSError as exc:
            raise SandboxError(f"`{shown} ...` could not be run ({exc}); {REMEDY}") from exc
        if check and done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip()[-_STDERR_CHARS:]
            raise SandboxError(f"`{shown} ...` failed with exit code {done.returncode}: {err or '(no stderr)'}")
        return done


def find_container_engine(preferred: str | None = None) -> ContainerEngine | None:
    """The engine to use: ``preferred`` (a name or a path) if it is installed, else ``None``.

    With no preference: docker, then podman -- the first that answers, else the first installed (so
    that the caller can say why it does not answer), else ``None``.
    """
    names = [preferred] if preferred else ["docker", "podman"]
    found = [ContainerEngine(path, _kind_of(name)) for name in names if (path := shutil.which(name))]
    if not found:
        return None
    if len(found) > 1:
        for engine in found:
            if engine.available()[0]:
                return engine
    return found[0]


def require_container_engine(preferred: str | None = None) -> ContainerEngine:
    """An engine that answers, or ``SandboxError`` saying what is missing and how to fix it."""
    engine = find_container_engine(preferred)
    if engine is None:
        what = f"no container engine `{preferred}` is installed" if preferred else (
            "no container engine (docker or podman) is installed")
        raise SandboxError(f"{what}: {REMEDY}")
    ok, detail = engine.available()
    if not ok:
        raise SandboxError(f"{detail}: {REMEDY}")
    return engine
