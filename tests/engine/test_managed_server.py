"""An engine's server as a managed process: ready when its probe says so, or an error with its log's tail.

Run on plain Python processes (the engines' own starts are in the real-engine tier): a server that
dies before it is ready, one that never becomes ready, and one that serves, then stops with its group."""

from __future__ import annotations

import sys
from dataclasses import dataclass
import urllib.request
from pathlib import Path

import pytest

from openenv_harness.engine.launcher import EngineStartError, ManagedServer, free_port


@dataclass
class _ToySettings:
    """A plain Python program as an engine: what ``ManagedServer`` starts from its settings."""

    code: str
    model_dir: Path
    port: int = 0

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.code]

    def environment(self) -> dict[str, str]:
        return {}


class _Python(ManagedServer[_ToySettings]):
    engine = "Toy"

    def __init__(self, code: str, log_dir: Path, port: int = 0) -> None:
        super().__init__(_ToySettings(code, log_dir / "model", port))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.port}"

    def _ready(self, deadline: float) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/", timeout=1) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self, timeout_s: float = 30.0) -> None:
        proc, self.process = self.process, None
        if proc is not None:
            proc.kill()
            proc.wait()
        self._close_log()


def test_a_server_that_dies_before_it_is_ready_fails_with_its_log(tmp_path: Path) -> None:
    server = _Python("print('loading weights'); print('bad flag: --nope'); raise SystemExit(3)", tmp_path)
    with pytest.raises(EngineStartError, match=r"Toy exited with code 3 before it was ready: .*bad flag: --nope"):
        server.start(timeout_s=60)
    assert server.process is None and server.log_path == tmp_path / f"toy-{server.settings.port}.log"
    assert server.settings.port > 0  # an open port was chosen for it


def test_a_server_that_never_serves_times_out_with_its_log(tmp_path: Path) -> None:
    server = _Python("import time; print('still compiling', flush=True); time.sleep(60)", tmp_path, port=free_port())
    with pytest.raises(EngineStartError, match=r"Toy was not ready after 2 s: still compiling"):
        server.start(timeout_s=2)
    assert server.process is None  # stopped on the way out


def test_a_server_that_serves_is_ready_and_stops(tmp_path: Path) -> None:
    port = free_port()
    code = f"import http.server as h; h.HTTPServer(('127.0.0.1', {port}), h.SimpleHTTPRequestHandler).serve_forever()"
    with _Python(code, tmp_path, port) as server:
        process = server.process
        assert process is not None and process.poll() is None
        with urllib.request.urlopen(server.url + "/", timeout=5) as resp:
            assert resp.status == 200
    assert server.process is None and process.poll() is not None
