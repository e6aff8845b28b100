"""A recorder in a process of its own, for tests that SIGKILL it and restart it on the same store.

In-process recorders (``RecorderServer``) cannot be killed without killing the test; durability and
placement tests need the real process boundary.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx


def start_recorder_process(store: Path, engine_url: str, port: int, admin_token: str,
                           *extra: str) -> subprocess.Popen:
    """``python -m openenv_harness.recorder`` on ``port``, returned once ``/healthz`` answers (60 s at most;
    then it is killed and the error carries the end of its stderr)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "openenv_harness.recorder", "--engine-url", engine_url, "--port", str(port),
         "--store", str(store), "--admin-token", admin_token, "--log-level", "error", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the recorder process did not start: " + proc.stderr.read().decode()[-2000:])


def child_pids(pid: int) -> list[int]:
    """The direct children of process ``pid``, read from each of its threads' ``children`` file.

    A thread can end between listing ``/proc/<pid>/task`` and reading its file (the recorder's worker
    threads come and go), so a vanished thread counts as one with no children rather than an error.
    """
    pids: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            pids.extend(int(p) for p in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return pids
