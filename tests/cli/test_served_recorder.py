"""The CLI against a recorder somebody already runs: a standalone reference engine serving the built-in
tasks by model name, ``serve`` in front of it, and ``run --recorder-url`` driving real agents through it
in incremental mode; the records stay on that recorder (``trace --url``). Every process is real and on
loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

TOKEN = "served-recorder-admin-token-0123456789"


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "openenv_harness.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


def _wait_ready(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready: {log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("served")
    engine_port, recorder_port = _free_port(), _free_port()
    engine = _start([sys.executable, "-m", "openenv_harness.testing.engine", "--port", str(engine_port),
                     "--builtin-tasks"], tmp / "engine.log")
    recorder = None
    try:
        _wait_ready(f"http://127.0.0.1:{engine_port}/v1/models", engine, tmp / "engine.log")
        recorder = _start([sys.executable, "-m", "openenv_harness.cli", "serve", "--port", str(recorder_port),
                           "--engine-url", f"http://127.0.0.1:{engine_port}", "--store", str(tmp / "records.db"),
                           "--admin-token", TOKEN], tmp / "recorder.log")
        _wait_ready(f"http://127.0.0.1:{recorder_port}/healthz", recorder, tmp / "recorder.log")
        yield f"http://127.0.0.1:{recorder_port}"
    finally:
        if recorder is not None:
            _stop(recorder)
        _stop(engine)


@pytest.mark.cli
def test_run_drives_real_agents_through_a_served_recorder_in_incremental_mode(served: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = _cli("run", "--harness", "pi", "--task", "fix-add", "--recorder-url", served, "--admin-token", TOKEN,
                "--model", "reference", "--prompt-mode", "incremental", "--require-exact-template", "--out", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [report] = json.loads((out / "summary.json").read_text())
    assert (report["reward"], report["agent_calls"], report["rows"]) == (1.0, 4, 1)
    assert report["training"]["strategies"]["split"] == {
        "rows": 1, "trainable_tokens": report["training"]["sampled_tokens"], "trainable_share": 1.0}
    assert report["training"]["constrained_calls"] == 0
    assert f"--url {served}" in done.stdout, "the records are on the served recorder, and the CLI says so"
    exported = _cli("trace", "export", report["session_id"], "--url", served, "--admin-token", TOKEN)
    rows = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [r["metadata"]["prompt_mode"]["continued"] for r in rows] == [False, True, True, True]
    harness = json.loads(_cli("trace", "export", report["session_id"], "--url", served, "--admin-token", TOKEN,
                              "--format", "harness").stdout)
    assert [row["reward"] for row in harness] == [1.0], "the outcome was stored on the served recorder"


def test_run_refuses_a_recorder_it_cannot_reach_before_any_rollout(tmp_path: Path) -> None:
    done = _cli("run", "--recorder-url", f"http://127.0.0.1:{_free_port()}", "--admin-token", TOKEN,
                "--model", "reference", "--out", str(tmp_path / "run"), timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("error: the recorder at") and "not reachable" in done.stderr
    assert not (tmp_path / "run").exists(), "nothing was run, nothing written"
