"""Sandboxes on Hugging Face Jobs (``huggingface_hub.Sandbox``), reached through the relay.

Why this shape: the agent inside must see exactly what it sees locally -- an OpenAI base URL on
``127.0.0.1`` and a per-rollout key -- while every byte of token evidence stays with the trainer.
So ``model_endpoint`` uploads the standard-library relay (``openenv_harness.relay``), starts it as
a *tracked* background process (an untracked one neither keeps the sandbox alive nor gets
cleaned up), and dials into it from here through ``Sandbox.proxy_url_for(port, "/relay")`` with
``Sandbox.proxy_headers`` re-read at every connect. The agent's base URL keeps the recorder's path;
only host and port change.

Modes:

* **Dedicated** (default): one HF job per sandbox; the relay binds TCP on ``127.0.0.1``.
* **Pooled** (``pool=SandboxPool(...)``): cheap sandboxes packed on shared hosts. Landlock forbids
  *any* TCP bind there, 127.0.0.1 included, so an agent cannot reach a localhost relay: relay mode
  raises ``SandboxError``. Use dial-out instead. (Pool processes also get RLIMIT_AS = 2 GiB, which
  breaks Node's ``fetch`` unless ``NODE_OPTIONS=--disable-wasm-trap-handler`` is set.)
* **Dial-out** (``dial_out_url=...``): the sandbox reaches a trainer-side URL you publish yourself
  (a tunnel to the recorder); ``model_endpoint`` rebases the recorder URL onto it and no relay runs.

Secrets: the per-rollout key is passed per command (``run``/``start`` ``env=``), never in the job's
``env`` (visible in job metadata). The WebSocket upgrade carries the HF bearer in
``Authorization`` -- everything in a dedicated VM runs next to the relay, so pass ``proxy_token``
(a narrow read-only token) to keep your main token out of the sandbox. Nothing here logs either.
"""

from __future__ import annotations

import json
import logging
import secrets
import shlex
import signal
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from openenv_harness.relay import (
    RELAY_TOKEN_HEADER,
    RELAY_WS_PATH,
    DialerThread,
    RelayDialer,
    RelayUnavailableError,
    sandbox_program_sources,
)
from openenv_harness.sandbox.base import BackgroundProcess, CommandResult, ModelEndpoint, Sandbox, SandboxError
from openenv_harness.sandbox.relayed import RelayedEndpoint, rebase_url

if TYPE_CHECKING:
    from huggingface_hub import Sandbox as HubSandbox
    from huggingface_hub import SandboxPool

log = logging.getLogger("openenv_harness.sandbox.hf")

_RELAY_TOKEN_ENV = "OPENENV_RELAY_TOKEN"


def _hub_errors() -> tuple[type[Exception], ...]:
    """What the hub client raises: its own errors, Jobs API HTTP errors (``OSError`` subclasses)
    and transport errors of its HTTP library."""
    import httpx2  # noqa: PLC0415 -- imported with huggingface_hub, which is heavy
    from huggingface_hub.errors import SandboxError as HubSandboxError  # noqa: PLC0415

    return (HubSandboxError, OSError, httpx2.HTTPError)


class HFProcess(BackgroundProcess):
    """A background command of an ``HFSandbox``, tracked by the sandbox server.

    The server reports no signal for a killed process; like a local process killed by SIGKILL
    (what the server sends), it then reads as ``-9``.
    """

    def __init__(self, sandbox: "HFSandbox", hub_process: Any, stem: str) -> None:
        self._sandbox = sandbox
        self._hub_process = hub_process
        self._stem = stem
        self._exit_code: int | None = None

    def poll(self) -> int | None:
        if self._exit_code is not None:
            return self._exit_code
        listed = {p.id: p for p in self._sandbox._call("list processes", self._sandbox.hub.processes)}
        entry = listed.get(self._hub_process.id)
        if entry is not None and entry.running:
            return None
        code = entry.exit_code if entry is not None else None
        if entry is None:  # evicted from the server's bounded list: the wrapper left a file
            try:
                code = int(self._sandbox.read_file(f"{self._stem}.exit").decode().strip())
            except (SandboxError, ValueError):
                code = None
        self._exit_code = code if code is not None else -signal.SIGKILL
        return self._exit_code

    def wait(self, timeout_s: float | None = None) -> int | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        delay = 0.05
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                return None
            pause = delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic()))
            time.sleep(pause)
            delay = min(delay * 2, 1.0)
        return code

    def kill(self) -> None:
        self._sandbox._call("kill a process", self._hub_process.kill)

    @property
    def stdout_path(self) -> str:
        return f"{self._stem}.stdout"

    @property
    def stderr_path(self) -> str:
        return f"{self._stem}.stderr"


class HFSandbox(RelayedEndpoint, Sandbox):
    """One rollout's sandbox on Hugging Face Jobs; see the module docstring."""

    def __init__(
        self,
        *,
        image: str = "python:3.12",
        flavor: str = "cpu-basic",
        idle_timeout_s: int = 600,
        namespace: str | None = None,
        token: str | None = None,
        labels: Mapping[str, str] | None = None,
        start_timeout_s: float = 180.0,
        pool: "SandboxPool | None" = None,
        dial_out_url: str | None = None,
        proxy_token: str | None = None,
        ws_scheme: str = "wss://",
        python: str = "python3",
        relay_idle_exit_s: float = 300.0,
        relay_start_timeout_s: float = 30.0,
        relay_connect_timeout_s: float = 30.0,
        relay_window: int | None = None,
    ) -> None:
        self.image = image
        self.flavor = flavor
        self.idle_timeout_s = idle_timeout_s
        self.namespace = namespace
        self._token = token
        self.labels = {"openenv-harness": "1", **dict(labels or {})}
        self.start_timeout_s = start_timeout_s
        self.pool = pool
        self.dial_out_url = dial_out_url
        self._proxy_token = proxy_token
        self.ws_scheme = ws_scheme
        self.python = python
        self.relay_idle_exit_s = relay_idle_exit_s
        self.relay_start_timeout_s = relay_start_timeout_s
        self.relay_connect_timeout_s = relay_connect_timeout_s
        self.relay_window = relay_window
        self._hub: "HubSandbox | None" = None
        self._remote_home: str | None = None
        self._root: str | None = None
        self._closed = False
        self._started = 0
        self._relay_process: Any = None
        self._relay_http_port: int | None = None
        self._relay_target: str | None = None
        self._dialer: DialerThread | None = None

    # -- layout ---------------------------------------------------------------------------------

    @property
    def hub(self) -> "HubSandbox":
        """The underlying ``huggingface_hub.Sandbox``."""
        if self._hub is None:
            raise SandboxError("the sandbox is not started; call start_sandbox() or use it as a context manager")
        return self._hub

    @property
    def root(self) -> str:
        if self._root is None:
            raise SandboxError("the sandbox is not started; call start_sandbox() or use it as a context manager")
        return self._root

    @property
    def workdir(self) -> str:  # type: ignore[override]
        return f"{self.root}/workdir"

    @property
    def home(self) -> str:  # type: ignore[override]
        return f"{self.root}/home"

    @property
    def logs_dir(self) -> str:
        return f"{self.root}/logs"

    remote = True

    @property
    def relay_dialer(self) -> DialerThread | None:
        """The trainer-side dialer, once ``model_endpoint`` started the relay."""
        return self._dialer

    def infrastructure_faults(self) -> list[str]:
        """The relay's faults, as its dialer counted them (``DialerStats``)."""
        return self.relay_faults()

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call the hub client, turning its errors into ``SandboxError`` that say what failed."""
        try:
            return fn(*args, **kwargs)
        except _hub_errors() as exc:
            raise SandboxError(f"HF sandbox: cannot {what}: {exc}") from exc

    def _absolute(self, path: str, base: str | None = None) -> str:
        return path if path.startswith("/") else f"{(base or self.workdir).rstrip('/')}/{path}"

    def _files_path(self, path: str) -> str:
        """The files API roots pooled sandboxes at their home: translate absolute paths."""
        absolute = self._absolute(path)
        if self.pool is None:
            return absolute
        home = (self._remote_home or "").rstrip("/")
        if absolute != home and not absolute.startswith(home + "/"):
            raise SandboxError(f"pooled sandboxes can only write under their home {home}, not {absolute}")
        return absolute[len(home):] or "/"

    # -- lifecycle ------------------------------------------------------------------------------

    def start_sandbox(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox is closed; create a new one")
        if self._hub is not None:
            return
        if self.pool is not None:
            self._hub = self._call("create a pooled sandbox", self.pool.create, idle_timeout=self.idle_timeout_s)
        else:
            from huggingface_hub import Sandbox as HubSandbox  # noqa: PLC0415 -- heavy import

            self._hub = self._call(
                "create a sandbox", HubSandbox.create, self.image, flavor=self.flavor,
                idle_timeout=self.idle_timeout_s, namespace=self.namespace, labels=self.labels,
                start_timeout=self.start_timeout_s, token=self._token,
            )
        try:
            probe = self._call("probe the sandbox", self.hub.run, 'printf %s "$HOME"', check=False)
            self._remote_home = probe.stdout.strip() or "/root"
            self._root = f"{self._remote_home.rstrip('/')}/openenv-harness"
            for sub in ("workdir", "home/.config", "home/.cache", "home/.local/share", "home/.local/state",
                        "tmp", "logs", "relay"):
                self._call("create directories", self.hub.files.mkdir, self._files_path(f"{self._root}/{sub}"))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop the dialer and kill the sandbox (a pooled one is removed from its host)."""
        if self._closed:
            return
        self._closed = True
        if self._dialer is not None:
            try:
                self._dialer.stop()
            except Exception:  # noqa: BLE001 -- the sandbox must be killed whatever happens here
                log.exception("stopping the relay dialer of %s failed", self._hub.id if self._hub else "?")
            self._dialer = None
        hub = self._hub
        if hub is None:
            return
        for _ in range(3):
            hub.kill()  # warns instead of raising; a later call retries
            if getattr(hub, "_killed", True):
                return
            time.sleep(0.5)
        log.error("could not kill HF sandbox %s; stop it with `hf sandbox kill %s`", hub.id, hub.id)

    # -- the model endpoint ---------------------------------------------------------------------

    def model_endpoint(self, recorder_base_url: str, api_key: str) -> ModelEndpoint:
        """A localhost relay URL (or the dial-out URL) for the agent; see the module docstring."""
        if self.dial_out_url is not None:
            return ModelEndpoint(base_url=rebase_url(recorder_base_url, self.dial_out_url), api_key=api_key)
        if self.pool is not None:
            raise SandboxError(
                "pooled HF sandboxes cannot bind any TCP port (127.0.0.1 included), so an agent there cannot "
                "reach a localhost relay; use a dedicated sandbox, or dial_out_url= with a tunnel to the recorder"
            )
        return self.relay_endpoint(recorder_base_url, api_key)

    def _start_relay(self, origin: str, path_prefix: str) -> None:
        hub = self.hub
        relay_dir = f"{self.root}/relay"
        for name, source in sandbox_program_sources().items():
            self._call("upload the relay", hub.files.write, self._files_path(f"{relay_dir}/{name}"), source)
        relay_token = secrets.token_urlsafe(24)
        stdout_path, stderr_path = f"{relay_dir}/relay.stdout", f"{relay_dir}/relay.stderr"
        args = [self.python, f"{relay_dir}/sandbox_relay.py", "--http-port", "0", "--ws-port", "0",
                "--idle-exit-s", str(self.relay_idle_exit_s), "--token-env", _RELAY_TOKEN_ENV]
        if self.relay_window is not None:
            args += ["--window-bytes", str(self.relay_window)]
        command = f"exec {shlex.join(args)} >{shlex.quote(stdout_path)} 2>{shlex.quote(stderr_path)} </dev/null"
        self._relay_process = self._call(
            "start the relay", hub.run, command, background=True, env={_RELAY_TOKEN_ENV: relay_token}
        )
        ready = self._await_relay_ready(stdout_path, stderr_path)
        self._relay_http_port = int(ready["http_port"])
        ws_port = int(ready["ws_port"])
        proxy_token = self._proxy_token

        def ws_url() -> str:
            return hub.proxy_url_for(ws_port, RELAY_WS_PATH, scheme=self.ws_scheme)

        def headers() -> dict[str, str]:
            current = dict(hub.proxy_headers)  # re-read on every connect: the bearer may rotate
            if proxy_token is not None:
                current["Authorization"] = f"Bearer {proxy_token}"
            current[RELAY_TOKEN_HEADER] = relay_token
            return current

        dialer = DialerThread(
            lambda: RelayDialer(ws_url, headers, origin, allowed_path_prefixes=[path_prefix]),
            name=f"relay-dialer-{hub.id}",
        ).start()
        try:
            dialer.wait_connected(self.relay_connect_timeout_s)
        except RelayUnavailableError as exc:
            dialer.stop()  # leave nothing half-up: a later call starts over cleanly
            self._call("stop the relay", self._relay_process.kill)
            raise SandboxError(f"the relay in sandbox {hub.id} did not accept the trainer's connection: {exc}") from exc
        self._dialer, self._relay_target = dialer, origin

    def _await_relay_ready(self, stdout_path: str, stderr_path: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.relay_start_timeout_s
        while True:
            try:
                first_line = self.read_file(stdout_path).split(b"\n", 1)[0]
                if first_line.strip():
                    ready = json.loads(first_line)
                    if ready.get("event") == "ready":
                        return ready
            except (SandboxError, ValueError):
                pass
            gone = not any(p.id == self._relay_process.id and p.running
                           for p in self._call("list processes", self.hub.processes))
            if gone or time.monotonic() >= deadline:
                try:
                    tail = self.read_file(stderr_path).decode("utf-8", "replace")[-2000:]
                except SandboxError:
                    tail = "<no stderr>"
                state = "exited" if gone else f"was not ready after {self.relay_start_timeout_s:.0f}s"
                raise SandboxError(f"the relay in sandbox {self.hub.id} {state} (is {self.python} in the image?). "
                                   f"stderr:\n{tail}")
            time.sleep(0.1)

    # -- files and commands ---------------------------------------------------------------------

    def write_file(self, path: str, data: bytes | str, mode: int | None = None) -> None:
        target = self._files_path(path)
        octal = None if mode is None else format(mode, "o")
        self._call(f"write {path!r}", self.hub.files.write, target, data, mode=octal)

    def read_file(self, path: str) -> bytes:
        return self._call(f"read {path!r}", self.hub.files.read, self._files_path(path))

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """What every command gets on top of the image's environment: the private HOME, XDG and
        TMPDIR directories, then ``extra`` (where per-rollout keys belong)."""
        home = self.home
        env = {
            "HOME": home, "XDG_CONFIG_HOME": f"{home}/.config", "XDG_DATA_HOME": f"{home}/.local/share",
            "XDG_CACHE_HOME": f"{home}/.cache", "XDG_STATE_HOME": f"{home}/.local/state", "TMPDIR": f"{self.root}/tmp",
        }
        env.update({str(k): str(v) for k, v in (extra or {}).items()})
        return env

    def run(
        self,
        cmd: list[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float | None = None,
        stdin: str | None = None,
    ) -> CommandResult:
        result = self._call(
            "run a command", self.hub.run, cmd, env=self.environment(env),
            cwd=self._absolute(cwd) if cwd else self.workdir, timeout=timeout_s, stdin=stdin, check=False,
        )
        return CommandResult(
            exit_code=None if result.timed_out else result.exit_code, stdout=result.stdout, stderr=result.stderr,
            timed_out=result.timed_out, duration_s=result.duration_ms / 1000.0,
        )

    def start(
        self,
        cmd: list[str] | str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: str | None = None,
        name: str = "agent",
    ) -> HFProcess:
        """Start in the background (tracked by the server, so it keeps the sandbox alive); output
        goes to ``logs/<name>-<n>.{stdout,stderr}``, ``stdin`` is fed from a file."""
        if not name or "/" in name:
            raise SandboxError(f"invalid process name {name!r}")
        self._started += 1
        stem = f"{self.logs_dir}/{name}-{self._started}"
        stdin_path = "/dev/null"
        if stdin is not None:
            stdin_path = f"{stem}.stdin"
            self.write_file(stdin_path, stdin)
        inner = shlex.join(["/bin/sh", "-c", cmd]) if isinstance(cmd, str) else shlex.join(cmd)
        q = shlex.quote
        script = (
            f"cd {q(self._absolute(cwd) if cwd else self.workdir)} || exit 126\n"
            f"{inner} <{q(stdin_path)} >{q(stem + '.stdout')} 2>{q(stem + '.stderr')}\n"
            f"code=$?\necho $code >{q(stem + '.exit')}\nexit $code\n"
        )
        hub_process = self._call("start a command", self.hub.run, script, background=True, env=self.environment(env))
        return HFProcess(self, hub_process, stem)
