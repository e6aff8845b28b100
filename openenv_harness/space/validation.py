"""OpenEnv's validator with its runtime checks executed, where no Docker engine runs.

``openenv validate`` builds the package's image and starts it through a *validation provider*
(``openenv.validation.providers.ValidationProvider``); its only provider is Docker. This one, named
``local-process``, keeps everything of that contract a process can keep, and says what it cannot:

- ``build`` stages the Space folder's files -- what the Dockerfile's ``COPY`` lines take, checked to
  exist in the context -- into a fresh folder (the image's filesystem, without the OS layers), names
  it by the digest of its contents, and installs the agent CLIs the image's install step names (into
  this machine's prefix);
- ``start`` runs the image's own ``CMD`` with the image's ``ENV`` (only the port, home and data
  folder moved to this machine's places) and the staged sources first on ``sys.path`` -- what
  ``pip install`` of them does in the image -- then waits for ``/health``;
- no network policy, CPU or memory limits are enforced (no ``NETWORK_POLICY`` capability: the graders
  that need one are skipped, named); Node, the agent CLIs and Python are this machine's.

So OpenEnv's own graders -- startup, one episode over its WebSocket protocol, the reward, the
observation schema, the state contract -- run against the environment as the Space would serve it.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from openenv.validation.manifest import ExecutionDeclaration
from openenv.validation.providers import ExecResult, ProviderError, StartupError
from openenv.validation.runtime.contracts import LaunchSpec
from openenv.validation.types import ProviderCapability

from openenv_harness.harnesses.install import default_node_prefix, ensure_installed
from openenv_harness.recorder.serving import free_port
from openenv_harness.space.dockerfile import (
    Instruction,
    copied_sources,
    final_stage,
    image_cmd,
    image_env,
    parse_dockerfile,
)

#: ENV values that name places on the machine the image runs on; everything else is used verbatim
MACHINE_SPECIFIC = ("PORT", "HOME", "OEH_DATA_DIR")
#: environment this machine provides in place of the image's OS layers (tools on PATH, the agent CLIs)
HOST_PASSTHROUGH = ("PATH", "LANG")
MAX_LOG_BYTES = 65536


def installed_clis(stage: list[Instruction]) -> list[str]:
    """The agent CLIs the image's ``RUN python -m openenv_harness.harnesses.install ...`` step installs."""
    names: list[str] = []
    for ins in stage:
        if ins.keyword != "RUN" or "openenv_harness.harnesses.install" not in ins.args:
            continue
        words = shlex.split(ins.args.split("openenv_harness.harnesses.install", 1)[1].split("&&", 1)[0])
        names += [w for w in itertools.takewhile(lambda w: not w.startswith("-"), words)]
    return names


class LocalProcessProvider:
    """A validation provider that runs the Space's image command as a local process (see the module)."""

    name = "local-process"
    capabilities = frozenset({ProviderCapability.IMAGE_BUILD, ProviderCapability.EXEC})
    supported_network_modes = frozenset({"public"})

    def __init__(self, workdir: Path | None = None, *, extra_env: dict[str, str] | None = None) -> None:
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="oeh-validate-"))
        self.extra_env = dict(extra_env or {})
        self._builds: dict[str, tuple[Path, list[str], dict[str, str]]] = {}

    def build(self, root: Path, execution: ExecutionDeclaration) -> str:
        context = (root / execution.context).resolve()
        dockerfile = (root / execution.dockerfile).resolve()
        if not dockerfile.is_file():
            raise ProviderError(f"no Dockerfile at {execution.dockerfile}")
        stage = final_stage(parse_dockerfile(dockerfile))
        image = self.workdir / "image"
        if image.exists():
            shutil.rmtree(image)
        digest = hashlib.sha256()
        for source in copied_sources(stage):
            path = context / source
            if not path.exists():
                raise ProviderError(f"COPY {source}: not in the build context")
            for file in sorted([path] if path.is_file() else (p for p in path.rglob("*") if p.is_file())):
                rel = file.relative_to(context).as_posix()
                if "__pycache__" in rel:
                    continue
                target = image / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, target)
                digest.update(rel.encode() + b"\0" + file.read_bytes())
        # the image's own step that installs the pinned agent CLIs, done for this machine's prefix
        ensure_installed(installed_clis(stage))
        ref = "sha256:" + digest.hexdigest()
        self._builds[ref] = (image, image_cmd(stage), image_env(stage))
        return ref

    def start(self, spec: LaunchSpec) -> "LocalRunningSubject":
        if spec.network.mode not in self.supported_network_modes:
            raise ProviderError(f"{self.name} cannot enforce network mode {spec.network.mode}")
        if spec.image_ref not in self._builds:
            raise ProviderError(f"unknown image {spec.image_ref}")
        image, argv, env = self._builds[spec.image_ref]
        if argv[0] != "python":
            raise ProviderError(f"the image's CMD starts {argv[0]!r}; this provider runs Python entry points")
        home = self.workdir / f"home-{spec.run_id}"
        home.mkdir(parents=True, exist_ok=True)
        port = free_port()
        environ = {**{k: os.environ[k] for k in HOST_PASSTHROUGH if k in os.environ}, **env,
                   "PORT": str(port), "HOME": str(home), "OEH_DATA_DIR": str(home / "data"),
                   # the image's `pip install . ./envs/harness_env`: the staged sources first on the path
                   "PYTHONPATH": os.pathsep.join([str(image), str(image / "envs")]),
                   **spec.env_vars, **self.extra_env}
        # the agent CLIs this machine installed (the image installs its own at build time, into its prefix)
        environ["OPENENV_HARNESS_NODE_PREFIX"] = str(default_node_prefix())
        log_path = self.workdir / f"{spec.run_id}.log"
        log = log_path.open("wb")
        process = subprocess.Popen([sys.executable, *argv[1:]], cwd=home, env=environ, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        subject = LocalRunningSubject(f"http://127.0.0.1:{port}", process, log_path, image, spec)
        try:
            subject.wait_healthy(spec.startup_timeout_s)
        except BaseException:
            subject.stop()
            raise
        return subject


class LocalRunningSubject:
    """The started image command: reachable on loopback, exec-able in the image's folder, stoppable."""

    def __init__(self, base_url: str, process: subprocess.Popen[bytes], log_path: Path, image: Path,
                 spec: LaunchSpec) -> None:
        self.base_url = base_url
        self.process = process
        self.log_path = log_path
        self.image = image
        self.spec = spec

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise StartupError(f"the image's command exited {self.process.returncode}: {self.logs(4000)}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        raise StartupError(f"no healthy /health within {timeout_s:.0f} s: {self.logs(4000)}")

    def inspect(self) -> dict[str, Any]:
        return {"provider": "local-process", "pid": self.process.pid, "running": self.process.poll() is None,
                "limits": None, "network": "not enforced"}

    def logs(self, max_bytes: int = MAX_LOG_BYTES) -> str:
        if not 0 < max_bytes <= MAX_LOG_BYTES:
            raise ValueError(f"max_bytes must be between 1 and {MAX_LOG_BYTES}")
        data = self.log_path.read_bytes() if self.log_path.exists() else b""
        return data[-max_bytes:].decode("utf-8", "replace")

    def exec(self, argv: list[str], timeout_s: float) -> ExecResult:
        if not argv or any(not isinstance(a, str) or "\0" in a for a in argv) or not argv[0]:
            raise ValueError("exec requires a nonempty argument vector without null bytes")
        if self.process.poll() is not None:
            raise ProviderError("Subject has stopped")
        started = time.monotonic()
        try:
            done = subprocess.run(argv, cwd=self.image, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise ProviderError(f"exec timed out after {timeout_s} s") from exc
        return ExecResult(done.returncode, done.stdout, done.stderr, time.monotonic() - started)

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, 15)
                self.process.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.process.pid, 9)
                except ProcessLookupError:
                    pass
                self.process.wait(timeout=10)
