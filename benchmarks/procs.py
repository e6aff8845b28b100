"""Start, watch and stop the benchmark's processes; read their CPU time and memory from /proc.

Why separate processes: the numbers must be per process (engine, recorder or capture, load
generator), exactly what ``/proc/<pid>/stat`` and ``/proc/<pid>/status`` say, and a proxy sharing
an interpreter with its load would hide its own cost. Every process is started by PID and stopped
by that PID; nothing is found or killed by name.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
PYTHON = sys.executable
_TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (its threads included), in seconds."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def descendants(pid: int) -> list[int]:
    """Live child processes of ``pid``, their children, ... (the recorder's index process)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return out
    for tid in tids:
        try:
            kids = [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except FileNotFoundError:
            continue
        for kid in kids:
            out += [kid, *descendants(kid)]
    return out


def _over_tree(pid: int, read: Callable[[int], float]) -> float:
    """``read`` of a process plus that of each live descendant (one that exits meanwhile counts 0)."""
    total = read(pid)
    for kid in descendants(pid):
        try:
            total += read(kid)
        except (FileNotFoundError, RuntimeError):
            pass
    return total


def tree_cpu_seconds(pid: int) -> float:
    """``cpu_seconds`` of a process and its live descendants together."""
    return _over_tree(pid, cpu_seconds)


def tree_rss_bytes(pid: int) -> int:
    """``rss_bytes`` of a process and its live descendants together (shared pages counted twice)."""
    return int(_over_tree(pid, rss_bytes))


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def system_busy_seconds() -> float:
    """CPU seconds all processes have been busy since boot, summed over cores (``/proc/stat``)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _TICKS


def background_cores(seconds: float = 1.0) -> float:
    """How many cores were busy over the next ``seconds`` (nothing of ours should be running)."""
    b0, t0 = system_busy_seconds(), time.monotonic()
    time.sleep(seconds)
    return (system_busy_seconds() - b0) / (time.monotonic() - t0)


def wait_for_quiet(max_wait_s: float, threshold_cores: float = 0.3) -> float:
    """Wait (up to ``max_wait_s``) for a second in which other work uses < ``threshold_cores``.

    The machine is shared; this only avoids starting a cell in the middle of someone's burst.
    Returns the last measured background load.
    """
    deadline = time.monotonic() + max_wait_s
    busy = background_cores(1.0)
    while busy > threshold_cores and time.monotonic() < deadline:
        busy = background_cores(1.0)
    return busy


def code_fingerprint(package: Path = ROOT / "openenv_harness" / "recorder") -> str:
    """A short hash of the recorder's source files: a cell whose code changed while it ran is flagged."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        h.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:12]


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


@dataclass
class Proc:
    """One started server process and where it listens."""

    name: str
    argv: list[str]
    port: int
    ready_path: str
    log_path: Path
    popen: subprocess.Popen | None = None
    #: where it runs: ``python -m`` imports from here first (an A/B runs other code from its own tree)
    cwd: Path = ROOT
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def start(self, timeout_s: float = 60.0) -> Proc:
        self._log = open(self.log_path, "ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.popen = subprocess.Popen(self.argv, cwd=self.cwd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + self.ready_path, timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"{self.name} not ready after {timeout_s}s; see {self.log_path}")

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 10 s. Returns the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.popen.returncode

    def __enter__(self) -> Proc:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def engine_proc(mode: str, prompt_tokens: int, logs: Path) -> Proc:
    port = free_port()
    argv = [PYTHON, str(BENCH / "lean_engine.py"), "--port", str(port), "--mode", mode,
            "--prompt-tokens", str(prompt_tokens), "--completion-tokens", "50"]
    return Proc("engine", argv, port, "/health", logs / f"engine-{port}.log")


def recorder_proc(engine_url: str, store: Path, admin_token: str, logs: Path) -> Proc:
    port = free_port()
    argv = [PYTHON, "-m", "openenv_harness.recorder", "--engine-url", engine_url, "--port", str(port),
            "--store", str(store), f"--admin-token={admin_token}"]
    if os.environ.get("OEH_BENCH_INDEX_PRIORITY"):  # A/B of the index process's priority (default: the recorder's)
        argv += ["--index-priority", os.environ["OEH_BENCH_INDEX_PRIORITY"]]
    if os.environ.get("OEH_BENCH_STORE_BACKLOG_MB"):  # A/B of the backlog's byte bound (trees that have it)
        argv += ["--store-backlog-mb", os.environ["OEH_BENCH_STORE_BACKLOG_MB"]]
    return Proc("recorder", argv, port, "/healthz", logs / f"recorder-{port}.log")


def capture_proc(engine_url: str, logs: Path) -> Proc:
    """OpenEnv 0.10's capture server through its own CLI, default settings."""
    port = free_port()
    argv = [PYTHON, "-m", "openenv.core.harness.capture.server", "--llm-url", f"{engine_url}/v1",
            "--model", "fake-model", "--host", "127.0.0.1", "--port", str(port)]
    return Proc("capture", argv, port, "/health", logs / f"capture-{port}.log")


def floor_proc(engine_url: str, journal: Path, logs: Path) -> Proc:
    """The baseline proxy (``floor_proxy.py``): the per-call work no recording proxy can skip."""
    port = free_port()
    argv = [PYTHON, str(BENCH / "floor_proxy.py"), "--engine-url", engine_url, "--port", str(port),
            "--journal", str(journal)]
    return Proc("floor", argv, port, "/health", logs / f"floor-{port}.log")


def baseline_tree(ref: str, prefix: str = "oeh-base-") -> Path:
    """``git archive REF openenv_harness`` unpacked in a temporary folder: another version's code, whose
    processes run from there (``Proc.cwd``) beside this tree's."""
    import tempfile

    out = Path(tempfile.mkdtemp(prefix=prefix))
    archive = subprocess.run(["git", "archive", ref, "openenv_harness"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def run_json(argv: list[str], timeout_s: float) -> dict:
    """Run a helper process (the load generator) and parse the JSON line it prints."""
    import json

    done = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[1]} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return json.loads(done.stdout.decode().strip().splitlines()[-1])
