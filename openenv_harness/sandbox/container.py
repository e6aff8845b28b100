"""The container sandbox: each rollout in a container of its own, with no network but its loopback.

Why it looks the way it does:

* **Nothing of the host's but what is mounted read-only.** The container runs an image of its own
  (``container_image.DEFAULT_IMAGE``, built from Debian packages), as an unprivileged user, with no
  capabilities, a read-only root, and limits on CPU, memory, processes and disk. The agent CLIs and
  the ``node`` binary come from the host, mounted read-only at the paths they have there (their
  launchers' paths stay valid).
* **Only the sandbox's own root is writable**: ``/sandbox`` (``workdir``, ``home``, ``tmp``,
  ``logs``) is a tmpfs of ``ContainerLimits.disk`` bytes, so a command that fills it gets ENOSPC
  and the host's disk is untouched; ``/tmp`` is a small tmpfs too.
* **No network, yet a model.** The container has only its own loopback (``--network none``, never a
  bridge). The agent reaches the recorder through the relay the Hugging Face sandbox uses: its
  agent end listens on the container's loopback, its trainer end on a Unix socket in a directory
  mounted from the host, which the trainer-side dialer connects to. Only the recorder's paths for
  this rollout cross it.
* **Every process is found again.** ``docker exec`` gives no handle on what it starts, so each
  command carries a marker in its environment and is stopped from inside (``container_procs``);
  ``close()`` removes the container, which ends everything in it.
* **Nothing outlives its trainer.** Containers are labelled with the process that owns them; the
  first container sandbox of a process removes those whose owner is gone (``container_reaper``).
"""

from __future__ import annotations

import logging
import os
import posixpath
import secrets
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from openenv_harness.relay import RELAY_TOKEN_HEADER, RELAY_WS_PATH, DialerThread, RelayDialer, sandbox_program_sources
from openenv_harness.relay.dialer import RelayUnavailableError
from openenv_harness.sandbox.base import CommandResult, ModelEndpoint, Sandbox, SandboxError
from openenv_harness.sandbox.container_engine import ContainerEngine, require_container_engine
from openenv_harness.sandbox.container_image import DEFAULT_IMAGE
from openenv_harness.sandbox.container_procs import COMMAND_MARKER_ENV, kill_command
from openenv_harness.sandbox.local import LocalProcess
from openenv_harness.sandbox.container_reaper import HOST_DIR_LABEL, OWNER_LABEL, SANDBOX_LABEL, reap_orphans, this_owner
from openenv_harness.sandbox.relayed import RelayedEndpoint

log = logging.getLogger(__name__)

#: The sandbox's root inside the container (a tmpfs); workdir, home, tmp and logs live under it.
ROOT = "/sandbox"
#: The unprivileged user commands run as (the image's ``agent``).
AGENT_USER = "1000:1000"
_RELAY_DIR, _LINK_DIR = "/oeh/relay", "/oeh/link"
_RELAY_TOKEN_ENV = "OEH_RELAY_TOKEN"
#: The longest Unix socket path the kernel takes (``sun_path``), terminator included.
_UNIX_PATH_MAX = 108
#: Engines whose orphans this process has already removed: the reaper runs once per process and
#: engine, at the first sandbox, not at every rollout.
_reaped: set[str] = set()
_reaped_lock = threading.Lock()


@dataclass(frozen=True)
class ContainerLimits:
    """What one rollout's container may use. ``disk`` bounds everything the sandbox writes."""

    cpus: float = 2.0
    memory: str = "4g"
    pids: int = 512
    disk: str = "1g"
    tmp: str = "64m"


class ContainerProcess(LocalProcess):
    """A background command in a container: the ``docker exec`` client (polled and waited on as a
    local process), and the marker that finds the command's processes inside to stop them."""

    def __init__(self, sandbox: ContainerSandbox, client: subprocess.Popen[bytes], marker: str, stem: str) -> None:
        super().__init__(client, f"{stem}.stdout", f"{stem}.stderr", sandbox.kill_grace_s)
        self._sandbox = sandbox
        self.marker = marker

    def kill(self) -> None:
        self._sandbox.stop_command(self.marker)
        if self.wait(5.0) is None:
            self._popen.kill()


class ContainerSandbox(RelayedEndpoint, Sandbox):
    """One rollout in a container of its own; see the module docstring."""

    remote = True  # the agent reaches the recorder through the relay, which can drop a call
    workdir = f"{ROOT}/workdir"
    home = f"{ROOT}/home"
    logs_dir = f"{ROOT}/logs"

    def __init__(
        self,
        *,
        image: str = DEFAULT_IMAGE,
        engine: ContainerEngine | str | None = None,
        node_prefix: str | os.PathLike[str] | None = None,
        node_binary: str | None = None,
        limits: ContainerLimits | None = None,
        parent_dir: str | os.PathLike[str] | None = None,
        kill_grace_s: float = 3.0,
        relay_idle_exit_s: float = 600.0,
        relay_start_timeout_s: float = 30.0,
        relay_connect_timeout_s: float = 30.0,
    ) -> None:
        """``node_prefix``: where the agent CLIs are installed (default: the harness install prefix),
        mounted read-only at the same path. ``node_binary``: the ``node`` mounted at
        ``/usr/local/bin/node`` (default: the host's, if any)."""
        from openenv_harness.harnesses.install import default_node_prefix

        self.image = image
        self._engine_choice = engine
        self.node_prefix = os.path.realpath(node_prefix if node_prefix is not None else default_node_prefix())
        found = node_binary or shutil.which("node")
        self.node_binary = os.path.realpath(found) if found else None
        self.limits = limits or ContainerLimits()
        self._parent_dir = str(parent_dir) if parent_dir is not None else None
        self.kill_grace_s = kill_grace_s
        self.relay_idle_exit_s = relay_idle_exit_s
        self.relay_start_timeout_s = relay_start_timeout_s
        self.relay_connect_timeout_s = relay_connect_timeout_s
        self.sandbox_id = uuid.uuid4().hex
        self.container_name = f"openenv-harness-{self.sandbox_id[:16]}"
        self.engine: ContainerEngine | None = None
        self.host_dir: str | None = None
        self._started = False
        self._closed = False
        self._lock = threading.Lock()
        self._clients: list[subprocess.Popen[bytes]] = []
        self._commands = 0
        self._dialer: DialerThread | None = None
        self._relay_client: subprocess.Popen[bytes] | None = None
        self._relay_http_port: int | None = None
        self._relay_target: str | None = None
        self._link_fd: int | None = None

    def __enter__(self) -> ContainerSandbox:
        self.start_sandbox()
        return self

    # -- the container --------------------------------------------------------------------------

    def _engine(self) -> ContainerEngine:
        if self.engine is None:
            raise SandboxError("the sandbox is not started; call start_sandbox() or use it as a context manager")
        return self.engine

    def start_sandbox(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox is closed; create a new one")
        if self._started:
            return
        engine = (self._engine_choice if isinstance(self._engine_choice, ContainerEngine)
                  else require_container_engine(self._engine_choice))
        self.engine = engine
        with _reaped_lock:
            if engine.binary not in _reaped:
                reap_orphans(engine)
                _reaped.add(engine.binary)
        if not os.path.isdir(self.node_prefix):
            raise SandboxError(f"the agent CLIs' prefix {self.node_prefix} does not exist; install the agents first")
        host_dir = tempfile.mkdtemp(prefix="openenv-harness-ctr-", dir=self._parent_dir)
        self.host_dir = host_dir
        link_dir, relay_dir = os.path.join(host_dir, "link"), os.path.join(host_dir, "relay")
        os.makedirs(link_dir)
        os.chmod(link_dir, 0o777)  # the relay inside runs as the image's unprivileged user
        os.makedirs(relay_dir)
        for name, source in sandbox_program_sources().items():
            with open(os.path.join(relay_dir, name), "wb") as handle:
                handle.write(source)
        os.chmod(host_dir, 0o711)
        limits = self.limits
        args = [
            # never from a registry: an absent image is an error naming how to build it, not a pull of
            # whatever a registry serves under that name
            "run", "--detach", "--pull", "never", "--name", self.container_name, "--init",
            "--label", f"{SANDBOX_LABEL}={self.sandbox_id}", "--label", f"{OWNER_LABEL}={this_owner()}",
            "--label", f"{HOST_DIR_LABEL}={host_dir}",
            "--network", "none", "--read-only", "--user", AGENT_USER,
            "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--cpus", str(limits.cpus), "--memory", limits.memory, "--memory-swap", limits.memory,
            "--pids-limit", str(limits.pids),
            "--tmpfs", f"{ROOT}:rw,exec,size={limits.disk},mode=1777",  # podman takes no uid= here
            "--tmpfs", f"/tmp:rw,exec,size={limits.tmp},mode=1777",
            "--volume", f"{self.node_prefix}:{self.node_prefix}:ro",
            "--volume", f"{relay_dir}:{_RELAY_DIR}:ro",
            "--volume", f"{link_dir}:{_LINK_DIR}:rw",
        ]
        if self.node_binary:
            args += ["--volume", f"{self.node_binary}:/usr/local/bin/node:ro"]
        # not --workdir ROOT: the engine would make the tmpfs root-owned 0755 again
        args += ["--workdir", "/", self.image, "sleep", "infinity"]
        self._started = True  # from here on, close() has something to remove
        result = engine.run_cli(args, check=False, timeout_s=120)
        if result.returncode != 0:
            detail = result.stderr.decode("utf-8", "replace").strip()
            hint = (f" (build it: python -m openenv_harness.sandbox.container_image --tag {self.image})"
                    if "No such image" in detail or "image not known" in detail else "")
            self.close()
            raise SandboxError(f"cannot start a container from {self.image}: {detail}{hint}")
        # lay out the root, and read back the process limit the engine applied: an engine that drops
        # it (a cgroup it cannot write) would let a fork bomb reach the host, so that is refused
        layout = ('mkdir -p "$@" && { cat /sys/fs/cgroup/pids/pids.max 2>/dev/null '
                  '|| cat /sys/fs/cgroup/pids.max 2>/dev/null || echo unknown; }')
        made = self._exec(["sh", "-c", layout, "sh", self.workdir, self.logs_dir, f"{ROOT}/tmp", f"{self.home}/.config",
                           f"{self.home}/.local/share", f"{self.home}/.cache", f"{self.home}/.local/state"])
        if made.returncode != 0:
            self.close()
            raise SandboxError(f"cannot lay out {ROOT} in the container: {made.stderr.decode(errors='replace')}")
        applied = made.stdout.decode(errors="replace").strip()
        if applied != str(limits.pids):
            self.close()
            raise SandboxError(f"the container engine did not apply the process limit ({limits.pids}): the "
                               f"container's pids.max reads {applied!r}")

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """What every command gets on top of the image's own environment: a PATH with the agent
        CLIs first, LANG, the private HOME/XDG/TMPDIR, then ``extra``."""
        home = self.home
        env = {
            "PATH": os.pathsep.join([f"{self.node_prefix}/node_modules/.bin", f"{self.node_prefix}/venvs/.bin",
                                     "/usr/local/bin", "/usr/bin", "/bin"]),
            "LANG": "C.UTF-8", "HOME": home,
            "XDG_CONFIG_HOME": f"{home}/.config", "XDG_DATA_HOME": f"{home}/.local/share",
            "XDG_CACHE_HOME": f"{home}/.cache", "XDG_STATE_HOME": f"{home}/.local/state", "TMPDIR": f"{ROOT}/tmp",
        }
        env.update({str(k): str(v) for k, v in (extra or {}).items()})
        return env

    def _exec_argv(self, argv: list[str], env: Mapping[str, str], cwd: str, interactive: bool) -> list[str]:
        """``docker exec`` with each variable passed by name: the values travel in the client's own
        environment, never on a command line another host process could read."""
        options = ["exec", "--user", AGENT_USER, "--workdir", cwd]
        if interactive:
            options.append("--interactive")
        for name in env:
            options += ["--env", name]
        return [self._engine().binary, *options, self.container_name, *argv]

    def _client_env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {**os.environ, **env}

    def _exec(self, argv: list[str], *, stdin: bytes | None = None, timeout_s: float = 60.0) -> subprocess.CompletedProcess[bytes]:
        """A short command of the sandbox's own (no marker, no agent environment)."""
        return self._engine().run_cli(["exec", "--user", AGENT_USER, *(["--interactive"] if stdin is not None else []),
                                       self.container_name, *argv], input=stdin, timeout_s=timeout_s, check=False)

    def container_state(self) -> dict[str, Any] | None:
        """The engine's view of the container (status, exit code, OOM kill), None if it is gone."""
        result = self._engine().run_cli(
            ["inspect", "--format", "{{.State.Status}}\t{{.State.ExitCode}}\t{{.State.OOMKilled}}", self.container_name],
            check=False, timeout_s=30,
        )
        if result.returncode != 0:
            return None
        status, code, oom = (result.stdout.decode().strip().split("\t") + ["", ""])[:3]
        return {"status": status, "exit_code": int(code or 0), "oom_killed": oom == "true"}

    def infrastructure_faults(self) -> list[str]:
        """The relay's faults, and a container that is no longer running (then nothing the agent
        did afterwards can be judged: the rollout stays unscored)."""
        faults = self.relay_faults()
        if self._started and not self._closed:
            state = self.container_state()
            if state is None:
                faults.append(f"the container {self.container_name} is gone")
            elif state["status"] != "running":
                how = "killed for memory" if state["oom_killed"] else f"exit code {state['exit_code']}"
                faults.append(f"the container {self.container_name} is {state['status']} ({how})")
        return faults

    # -- paths and files ------------------------------------------------------------------------

    def _inside(self, path: str, base: str | None = None) -> str:
        joined = path if posixpath.isabs(path) else posixpath.join(base or self.workdir, path)
        clean = posixpath.normpath(joined)
        if clean != ROOT and not clean.startswith(ROOT + "/"):
            raise SandboxError(f"path {path!r} resolves to {clean}, outside the sandbox root {ROOT}")
        return clean

    def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> None:
        target = self._inside(path)
        payload = data.encode("utf-8") if isinstance(data, str) else data
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1" && { [ -z "$2" ] || chmod "$2" "$1"; }'
        result = self._exec(["sh", "-c", script, "sh", target, "" if mode is None else format(mode, "o")],
                            stdin=payload)
        if result.returncode != 0:
            raise SandboxError(f"cannot write {path!r} in the sandbox: {result.stderr.decode(errors='replace').strip()}")

    def read_file(self, path: str) -> bytes:
        target = self._inside(path)
        result = self._exec(["cat", "--", target])
        if result.returncode != 0:
            raise SandboxError(f"cannot read {path!r} in the sandbox: {result.stderr.decode(errors='replace').strip()}")
        return result.stdout

    # -- commands -------------------------------------------------------------------------------

    def _new_marker(self) -> str:
        with self._lock:
            self._commands += 1
            return f"{self.sandbox_id}-{self._commands}"

    def _spawn(self, cmd: list[str] | str, env: Mapping[str, str] | None, cwd: str | None, marker: str,
               **streams: Any) -> subprocess.Popen[bytes]:
        if self._closed:
            raise SandboxError("the sandbox is closed")
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else [str(part) for part in cmd]
        if not argv:
            raise SandboxError("empty command")
        full_env = {**self.environment(env), COMMAND_MARKER_ENV: marker}
        interactive = streams.get("stdin") is subprocess.PIPE
        exec_argv = self._exec_argv(argv, full_env, self._inside(cwd) if cwd else self.workdir, interactive)
        try:
            client = subprocess.Popen(exec_argv, env=self._client_env(full_env), start_new_session=True, **streams)
        except OSError as exc:
            raise SandboxError(f"cannot start {shlex.join(argv)[:200]}: {exc}") from exc
        with self._lock:
            self._clients.append(client)
        return client

    def stop_command(self, marker: str) -> None:
        """Stop every process of one command inside the container (SIGTERM, then SIGKILL)."""
        if self._closed or not self._started:
            return
        self._exec(kill_command(marker, self.kill_grace_s), timeout_s=self.kill_grace_s + 30)

    def run(
        self,
        cmd: list[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float | None = None,
        stdin: str | None = None,
    ) -> CommandResult:
        """Run to completion; on timeout every process of the command is stopped and ``timed_out`` set."""
        started = time.monotonic()
        marker = self._new_marker()
        client = self._spawn(cmd, env, cwd, marker, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        payload = stdin.encode("utf-8") if stdin is not None else None
        try:
            out, err = client.communicate(input=payload, timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            self.stop_command(marker)
            try:
                out, err = client.communicate(timeout=self.kill_grace_s + 5)
            except subprocess.TimeoutExpired:
                client.kill()
                out, err = client.communicate()
        return CommandResult(
            exit_code=None if timed_out else client.returncode,
            stdout=(out or b"").decode("utf-8", errors="replace"),
            stderr=(err or b"").decode("utf-8", errors="replace"),
            timed_out=timed_out, duration_s=time.monotonic() - started,
        )

    def start(
        self,
        cmd: list[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        name: str = "agent",
    ) -> ContainerProcess:
        """Start in the background; output goes to ``logs/<name>-<n>.{stdout,stderr}`` in the
        sandbox, ``stdin`` is fed from a file there (end-of-file after the text)."""
        if not name or "/" in name:
            raise SandboxError(f"invalid process name {name!r}")
        marker = self._new_marker()
        stem = f"{self.logs_dir}/{name}-{marker.rsplit('-', 1)[1]}"
        stdin_path = "/dev/null"
        if stdin is not None:
            stdin_path = f"{stem}.stdin"
            self.write_file(stdin_path, stdin)
        inner = shlex.join(["/bin/sh", "-c", cmd]) if isinstance(cmd, str) else shlex.join(cmd)
        q = shlex.quote
        script = f"exec {inner} <{q(stdin_path)} >{q(stem + '.stdout')} 2>{q(stem + '.stderr')}"
        client = self._spawn(script, env, cwd, marker, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        return ContainerProcess(self, client, marker, stem)

    # -- the model endpoint ---------------------------------------------------------------------

    def model_endpoint(self, recorder_base_url: str, api_key: str) -> ModelEndpoint:
        """A URL on the container's loopback, served by the relay (see the module docstring)."""
        return self.relay_endpoint(recorder_base_url, api_key)

    def _start_relay(self, origin: str, path_prefix: str) -> None:
        host_dir = self.host_dir
        if host_dir is None:
            raise SandboxError("the sandbox is not started; call start_sandbox() first")
        token = secrets.token_urlsafe(24)
        argv = ["python3", f"{_RELAY_DIR}/sandbox_relay.py", "--http-port", "0", "--ws-unix", f"{_LINK_DIR}/trainer.sock",
                "--idle-exit-s", str(self.relay_idle_exit_s), "--token-env", _RELAY_TOKEN_ENV]
        relay_env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", _RELAY_TOKEN_ENV: token, COMMAND_MARKER_ENV: "relay"}
        stderr_path = os.path.join(host_dir, "relay.stderr")
        with open(stderr_path, "wb") as stderr:
            self._relay_client = subprocess.Popen(
                self._exec_argv(argv, relay_env, ROOT, False), env=self._client_env(relay_env),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, start_new_session=True,
            )
        ready = self._await_relay_ready(self._relay_client, stderr_path)
        self._relay_http_port = int(ready["http_port"])
        # the socket is there: the link directory (a host directory) becomes read-only to the container,
        # so nothing the agent writes reaches the host's disk past the sandbox's own limit
        os.chmod(os.path.join(host_dir, "link"), 0o555)
        socket_path = os.path.join(host_dir, "link", "trainer.sock")
        if len(os.fsencode(socket_path)) >= _UNIX_PATH_MAX:  # a deep parent_dir: reach it through a held fd
            self._link_fd = os.open(os.path.join(host_dir, "link"), os.O_PATH)
            socket_path = f"/proc/self/fd/{self._link_fd}/trainer.sock"
        dialer = DialerThread(
            lambda: RelayDialer(lambda: f"ws://sandbox{RELAY_WS_PATH}", lambda: {RELAY_TOKEN_HEADER: token}, origin,
                                allowed_path_prefixes=[path_prefix], ws_proxy=None, unix_socket_path=socket_path),
            name=f"relay-dialer-{self.container_name}",
        ).start()
        try:
            dialer.wait_connected(self.relay_connect_timeout_s)
        except RelayUnavailableError as exc:
            dialer.stop()
            raise SandboxError(f"the relay in {self.container_name} did not accept the trainer's connection: {exc}") from exc
        self._dialer, self._relay_target = dialer, origin

    def _await_relay_ready(self, client: subprocess.Popen[bytes], stderr_path: str) -> dict[str, Any]:
        import json

        line: list[bytes] = []
        stdout: IO[bytes] | None = client.stdout
        reader = threading.Thread(target=lambda: line.append(stdout.readline() if stdout else b""), daemon=True)
        reader.start()
        reader.join(self.relay_start_timeout_s)
        try:
            ready = json.loads(line[0]) if line and line[0].strip() else {}
        except ValueError:
            ready = {}
        if ready.get("event") == "ready":
            return dict(ready)
        with open(stderr_path, "rb") as handle:
            tail = handle.read()[-2000:].decode("utf-8", "replace")
        state = "exited" if client.poll() is not None else f"was not ready after {self.relay_start_timeout_s:.0f}s"
        raise SandboxError(f"the relay in {self.container_name} {state} (does {self.image} have python3?). stderr:\n{tail}")

    # -- teardown -------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the relay link, remove the container (which ends every process in it) and its host
        directory. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._dialer is not None:
            try:
                self._dialer.stop()
            except Exception:  # noqa: BLE001 -- teardown goes on; the container still has to go
                log.exception("stopping the relay dialer of %s failed", self.container_name)
        if self.engine is not None and self._started:
            removed = self.engine.run_cli(["rm", "--force", "--volumes", self.container_name], check=False, timeout_s=120)
            if removed.returncode != 0 and b"No such container" not in removed.stderr:
                log.error("could not remove container %s: %s", self.container_name,
                          removed.stderr.decode(errors="replace").strip())
        with self._lock:
            clients = [*self._clients, *([self._relay_client] if self._relay_client else [])]
            self._clients.clear()
        for client in clients:
            if client.poll() is None:
                client.kill()
            client.wait()
        if self._link_fd is not None:
            os.close(self._link_fd)
            self._link_fd = None
        if self.host_dir is not None:
            shutil.rmtree(self.host_dir, ignore_errors=True)
