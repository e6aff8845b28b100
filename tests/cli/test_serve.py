"""``openenv-harness serve`` hands every setting to the recorder: each flag reaches the ``RecorderConfig``
that the recorder's ``serve`` runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from openenv_harness.recorder import RecorderConfig

FLAGS = ["--keep-alive-s", "12", "--backlog", "99", "--prompt-cache-mb", "3", "--store-backlog-mb", "5",
         "--admin-port", "8799", "--admin-nice", "-3"]
EXPECTED = {"keep_alive_timeout_s": 12.0, "listen_backlog": 99, "prompt_cache_mb": 3.0, "store_backlog_mb": 5.0,
            "admin_port": 8799, "admin_nice": -3}


def test_the_cli_serve_command_passes_each_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import openenv_harness.recorder.server as server
    from openenv_harness.cli.app import app

    seen: list[RecorderConfig] = []
    monkeypatch.setattr(server, "serve", lambda config, **kw: seen.append(config))
    result = CliRunner().invoke(app, ["serve", "--store", str(tmp_path / "r.db"), *FLAGS])
    assert result.exit_code == 0, result.output
    (config,) = seen
    assert {k: getattr(config, k) for k in EXPECTED} == EXPECTED


def test_serve_refuses_a_busy_port_before_printing_or_writing_anything(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "openenv_harness.cli", "serve", "--port", str(port),
                               "--store", str(tmp_path / "runs" / "r.db")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stdout == "", "no URL, token or login link of the other process"
    assert done.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}")
    assert not (tmp_path / "runs").exists(), "nothing left behind"
