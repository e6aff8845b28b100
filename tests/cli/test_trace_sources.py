"""``openenv-harness trace`` over several recorders and stores at once (sessions spread by the
factories' placement): every session listed with where it lives, each read from the one holding
it, a recorder that is down named while the others are read. Run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.testing.engine import EngineServer

CLI = [sys.executable, "-m", "openenv_harness.cli", "trace"]
ADMIN = "trace-sources-admin-token-0123456789"


def _trace(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "250"})


def _one_call(recorder: RecorderServer) -> str:
    with RecorderClient(recorder.url, ADMIN) as admin:
        s = admin.create_session(harness="pi")
    r = httpx.post(f"{s['base_url']}/chat/completions", headers={"authorization": f"Bearer {s['secret']}"}, timeout=60,
                   json={"model": "reference-model", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200
    return s["session_id"]


@pytest.fixture
def stores() -> Iterator[Path]:
    """A folder with a short path for the stores: the table's "where" column, in the CLI's 150 columns,
    cuts a long path short with "…", and pytest's tmp_path is a folder deeper under pytest-xdist."""
    with tempfile.TemporaryDirectory(prefix="oeh-trace-") as folder:
        yield Path(folder)


def test_trace_reads_several_recorders_and_stores(stores: Path) -> None:
    with EngineServer() as engine:
        recorders = [RecorderServer(RecorderConfig(store_path=str(stores / f"r{i}.db"), engine_url=engine.url,
                                                   admin_token=ADMIN)).start() for i in range(3)]
        try:
            live, down, stored = (_one_call(r) for r in recorders)
            recorders[1].stop()
            recorders[2].stop()  # read from its store file instead
            sources = ["--url", recorders[0].url, "--url", recorders[1].url, "--store", str(stores / "r2.db"),
                       "--admin-token", ADMIN]
            listed = _trace("list", *sources)
            assert listed.returncode == 0, listed.stderr
            assert live in listed.stdout and stored in listed.stdout and down not in listed.stdout
            assert recorders[0].url in listed.stdout and "r2.db" in listed.stdout  # where each session lives
            assert f"could not read {recorders[1].url}" in listed.stderr
            for session in (live, stored):
                exported = _trace("export", session, *sources)
                assert exported.returncode == 0, exported.stderr
                [entry] = [json.loads(line) for line in exported.stdout.splitlines()]
                assert entry["metadata"]["session_id"] == session
            missing = _trace("show", down, *sources)
            assert missing.returncode != 0 and f"no records for session {down}" in missing.stdout + missing.stderr
        finally:
            for recorder in recorders:
                recorder.stop()
