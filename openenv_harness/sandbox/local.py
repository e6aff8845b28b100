"""The local sandbox: a private temporary directory and subprocesses on this machine.

Why it looks the way it does:

* **Private root.** Each rollout gets ``<root>/workdir`` (the task), ``<root>/home`` (HOME and every
  XDG directory, so agent config, sessions and caches never touch the real user's), ``<root>/tmp``
  and ``<root>/logs``. Paths handed to ``write_file``/``read_file`` must stay inside the root.
* **Clean environment.** Commands see PATH (with the node prefix's ``node_modules/.bin`` first, then
  ``venvs/.bin``, where the Python agents' executables are linked), LANG, the private
  HOME/XDG/TMPDIR and what the caller passes -- nothing else. The parent's environment holds trainer
  secrets and provider API keys; an agent that can run ``env`` must not find them.
* **Process groups, and what leaves them.** Every command starts in a new session, so it leads its
  own process group. Both agents run each shell tool in yet another session, so killing a group is
  not enough: a timeout or ``kill()`` also kills every descendant, and ``close()`` also kills every
  process carrying this sandbox's marker in its environment (see ``proctree``) -- SIGTERM first,
  SIGKILL after a grace period.
* **Timeouts are wall-clock** and kill the whole tree, not just the leader.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from openenv_harness.sandbox.base import BackgroundProcess, CommandResult, ModelEndpoint, Sandbox, SandboxError
from openenv_harness.sandbox.proctree import (
    MARKER_ENV,
    ProcInfo,
    group_alive,
    group_members,
    marked,
    process_table,
    terminate,
    with_descendants,
)


def _kill_command_tree(popen: subprocess.Popen[bytes], grace_s: float) -> None:
    """Kill one command: its process group and every process below it, even in other groups."""
    pgid = popen.pid
    terminate(
        [pgid],
        lambda table: with_descendants(table, group_members(table, [pgid]) | {pgid}),
        grace_s,
        reap=popen.poll,
    )
    try:
        popen.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass


class LocalProcess(BackgroundProcess):
    """A background command of a ``LocalSandbox``; it leads its own process group."""

    def __init__(self, popen: subprocess.Popen[bytes], stdout_path: str, stderr_path: str, grace_s: float) -> None:
        self._popen = popen
        self._stdout_path = stdout_path
        self._stderr_path = stderr_path
        self._grace_s = grace_s

    @property
    def pid(self) -> int:
        return self._popen.pid

    def poll(self) -> int | None:
        return self._popen.poll()

    def wait(self, timeout_s: float | None = None) -> int | None:
        try:
            return self._popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        _kill_command_tree(self._popen, self._grace_s)

    @property
    def stdout_path(self) -> str:
        return self._stdout_path

    @property
    def stderr_path(self) -> str:
        return self._stderr_path


class LocalSandbox(Sandbox):
    """One rollout's private temporary root on this machine; see the module docstring."""

    def __init__(
        self,
        *,
        node_prefix: str | os.PathLike[str] | None = None,
        parent_dir: str | os.PathLike[str] | None = None,
        keep: bool = False,
        kill_grace_s: float = 3.0,
    ) -> None:
        """``node_prefix``: where the agent CLIs are installed (its ``node_modules/.bin`` goes first on
        PATH, then ``venvs/.bin``: links to the Python agents' executables, never a venv's own ``bin``,
        whose ``python3`` would shadow the one the agents' shell tools should find). ``parent_dir``: where the temporary root is created (default: the system temp dir).
        ``keep``: leave the root on disk after ``close()`` (for inspection)."""
        self._node_bin = (
            os.pathsep.join([str(Path(node_prefix) / "node_modules" / ".bin"), str(Path(node_prefix) / "venvs" / ".bin")])
            if node_prefix is not None else None
        )
        self._parent_dir = str(parent_dir) if parent_dir is not None else None
        self.keep = keep
        self.kill_grace_s = kill_grace_s
        self._root: str | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._groups: dict[int, subprocess.Popen[bytes]] = {}
        self._started = 0
        #: Put in every command's environment (``MARKER_ENV``) so that close() finds processes
        #: that left both the process group and the process tree.
        self.sandbox_id = uuid.uuid4().hex

    def __enter__(self) -> "LocalSandbox":
        self.start_sandbox()
        return self

    # -- layout ---------------------------------------------------------------------------------

    @property
    def root(self) -> str:
        if self._root is None:
            raise SandboxError("the sandbox is not started; call start_sandbox() or use it as a context manager")
        return self._root

    @property
    def workdir(self) -> str:  # type: ignore[override]
        return os.path.join(self.root, "workdir")

    @property
    def home(self) -> str:  # type: ignore[override]
        return os.path.join(self.root, "home")

    @property
    def logs_dir(self) -> str:
        return os.path.join(self.root, "logs")

    def start_sandbox(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox is closed; create a new one")
        if self._root is not None:
            return
        root = os.path.realpath(tempfile.mkdtemp(prefix="openenv-harness-", dir=self._parent_dir))
        self._root = root
        home = self.home
        for path in (
            self.workdir, self.logs_dir, os.path.join(root, "tmp"), os.path.join(home, ".config"),
            os.path.join(home, ".local", "share"), os.path.join(home, ".cache"), os.path.join(home, ".local", "state"),
        ):  # fmt: skip
            os.makedirs(path, exist_ok=True)

    def model_endpoint(self, recorder_base_url: str, api_key: str) -> ModelEndpoint:
        """Agents here reach the recorder directly: the URL is returned unchanged."""
        return ModelEndpoint(base_url=recorder_base_url, api_key=api_key)

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The whole environment a command gets: PATH, LANG, private HOME/XDG/TMPDIR, then ``extra``."""
        path = os.environ.get("PATH") or os.defpath
        if self._node_bin is not None:
            path = os.pathsep.join([self._node_bin, path])
        home = self.home
        env = {
            "PATH": path,
            "LANG": os.environ.get("LANG") or "C.UTF-8",
            "HOME": home,
            "XDG_CONFIG_HOME": os.path.join(home, ".config"),
            "XDG_DATA_HOME": os.path.join(home, ".local", "share"),
            "XDG_CACHE_HOME": os.path.join(home, ".cache"),
            "XDG_STATE_HOME": os.path.join(home, ".local", "state"),
            "TMPDIR": os.path.join(self.root, "tmp"),
        }
        if extra:
            env.update({str(k): str(v) for k, v in extra.items()})
        env[MARKER_ENV] = self.sandbox_id  # not overridable: close() relies on it
        return env

    def _inside(self, path: str, base: str | None = None) -> str:
        """Absolute real path of ``path`` (relative to ``base``/workdir); refuses to leave the root."""
        joined = path if os.path.isabs(path) else os.path.join(base or self.workdir, path)
        real = os.path.realpath(joined)
        if real != self.root and not real.startswith(self.root + os.sep):
            raise SandboxError(f"path {path!r} resolves to {real}, outside the sandbox root {self.root}")
        return real

    # -- files ----------------------------------------------------------------------------------

    def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> None:
        target = self._inside(path)
        payload = data.encode("utf-8") if isinstance(data, str) else data
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as handle:
                handle.write(payload)
            if mode is not None:
                os.chmod(target, mode)
        except OSError as exc:
            raise SandboxError(f"cannot write {path!r} in the sandbox: {exc}") from exc

    def read_file(self, path: str) -> bytes:
        target = self._inside(path)
        try:
            with open(target, "rb") as handle:
                return handle.read()
        except OSError as exc:
            raise SandboxError(f"cannot read {path!r} in the sandbox: {exc}") from exc

    # -- processes ------------------------------------------------------------------------------

    def _spawn(
        self, cmd: list[str] | str, env: Mapping[str, str] | None, cwd: str | None, **streams: object
    ) -> subprocess.Popen[bytes]:
        if self._closed:
            raise SandboxError("the sandbox is closed")
        self._forget_finished_groups()
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else [str(part) for part in cmd]
        if not argv:
            raise SandboxError("empty command")
        workdir = self._inside(cwd) if cwd is not None else self.workdir
        try:
            popen = subprocess.Popen(  # type: ignore[call-overload]
                argv, cwd=workdir, env=self.environment(env), start_new_session=True, **streams
            )
        except OSError as exc:
            raise SandboxError(f"cannot start {shlex.join(argv)[:200]}: {exc}") from exc
        with self._lock:
            self._groups[popen.pid] = popen
        return popen

    def _forget_finished_groups(self) -> None:
        """Stop tracking groups whose leader exited and that have no live member left.

        A group id is a pid; once the group is empty the number can be reused by an unrelated
        process, which ``close()`` must never signal.
        """
        table = process_table()
        with self._lock:
            for pgid, popen in list(self._groups.items()):
                if popen.poll() is None:
                    continue
                if table and any(info.alive and info.pgrp == pgid for info in table.values()):
                    continue
                if not table and group_alive(pgid):
                    continue
                del self._groups[pgid]

    def run(
        self,
        cmd: list[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float | None = None,
        stdin: str | None = None,
    ) -> CommandResult:
        """Run to completion; on timeout the whole process group is killed and ``timed_out`` set.

        Like ``subprocess.run``, this waits for stdout/stderr to close: a background child that keeps
        them open holds the call until the timeout.
        """
        started = time.monotonic()
        popen = self._spawn(
            cmd,
            env,
            cwd,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        payload = stdin.encode("utf-8") if stdin is not None else None
        try:
            out, err = popen.communicate(input=payload, timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_command_tree(popen, self.kill_grace_s)
            try:
                out, err = popen.communicate(timeout=self.kill_grace_s)
            except subprocess.TimeoutExpired:  # a process outside the group still holds the pipes
                out, err = b"", b""
        self._forget_finished_groups()
        return CommandResult(
            exit_code=None if timed_out else popen.returncode,
            stdout=(out or b"").decode("utf-8", errors="replace"),
            stderr=(err or b"").decode("utf-8", errors="replace"),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )

    def start(
        self,
        cmd: list[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        name: str = "agent",
    ) -> LocalProcess:
        """Start in the background; stdout/stderr go to ``logs/<name>-<n>.{stdout,stderr}``.

        ``stdin`` is written to a file and fed from it, so the process sees end-of-file after the
        text (an agent reading stdin never waits on a pipe nobody closes); ``None`` means /dev/null.
        """
        if not name or os.sep in name:
            raise SandboxError(f"invalid process name {name!r}")
        with self._lock:
            self._started += 1
            stem = os.path.join(self.logs_dir, f"{name}-{self._started}")
        out_path, err_path = f"{stem}.stdout", f"{stem}.stderr"
        stdin_handle: object = subprocess.DEVNULL
        if stdin is not None:
            Path(f"{stem}.stdin").write_bytes(stdin.encode("utf-8"))
            stdin_handle = open(f"{stem}.stdin", "rb")
        try:
            with open(out_path, "wb") as out, open(err_path, "wb") as err:
                popen = self._spawn(cmd, env, cwd, stdin=stdin_handle, stdout=out, stderr=err)
        finally:
            if stdin is not None:
                stdin_handle.close()  # type: ignore[attr-defined]
        return LocalProcess(popen, out_path, err_path, self.kill_grace_s)

    def close(self) -> None:
        """Kill every process group this sandbox started, then remove the root (unless ``keep``)."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            groups = dict(self._groups)
            self._groups.clear()

        def reap() -> None:
            for popen in groups.values():
                popen.poll()

        def everything_started_here(table: dict[int, ProcInfo]) -> set[int]:
            roots = group_members(table, groups) | set(groups) | marked(table, self.sandbox_id)
            return with_descendants(table, roots)

        terminate(groups, everything_started_here, self.kill_grace_s, reap=reap)
        reap()
        if self._root is not None and not self.keep:
            shutil.rmtree(self._root, onerror=_make_writable_and_retry)


def _make_writable_and_retry(func: object, path: str, _exc: object) -> None:
    """An agent may leave read-only directories behind; make them writable so removal succeeds."""
    try:
        parent = os.path.dirname(path)
        os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
        os.chmod(path, os.stat(path).st_mode | stat.S_IWUSR)
        func(path)  # type: ignore[operator]
    except OSError:
        pass
