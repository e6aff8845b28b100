"""Placing a preset's files in a sandbox and running it; the connect watch the CLI tests rely on."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from openenv_harness.harnesses import HarnessSetup, LaunchSpec, get_preset
from openenv_harness.harnesses.launch import place_files, run_once
from openenv_harness.sandbox import LocalSandbox, ModelEndpoint, SandboxError


def test_place_files_writes_and_hashes(tmp_path: Path) -> None:
    with LocalSandbox(parent_dir=tmp_path) as box:
        setup = HarnessSetup(
            endpoint=ModelEndpoint("http://127.0.0.1:9/v1", "k"), model="m", workdir=box.workdir, home=box.home
        )
        spec = get_preset("opencode").prepare(setup, "task")
        hashes = place_files(box, spec)
        assert set(hashes) == set(spec.files)
        for path, digest in hashes.items():
            assert hashlib.sha256(box.read_file(path)).hexdigest() == digest
        assert Path(box.home, ".config", "opencode", "node_modules").is_dir()


def test_run_once_reads_a_failing_agent(tmp_path: Path) -> None:
    with LocalSandbox(parent_dir=tmp_path) as box:
        setup = HarnessSetup(
            endpoint=ModelEndpoint("http://127.0.0.1:9/v1", "k"), model="m", workdir=box.workdir, home=box.home
        )
        box.write_file("fake-pi", "#!/bin/sh\necho 'Error: no model' >&2\nexit 3\n", mode=0o755)
        run = run_once(get_preset("pi"), box, setup, "task", timeout_s=10, executable=f"{box.workdir}/fake-pi")
        assert (run.result.ok, run.result.exit_code, run.result.error) == (False, 3, "Error: no model")
        assert Path(box.home, ".pi", "agent", "settings.json").is_file()  # files were placed first
        with pytest.raises(SandboxError, match="cannot start"):
            run_once(get_preset("pi"), box, setup, "task", timeout_s=10, executable=str(tmp_path / "no-such-pi"))


def test_connect_watch_sees_outbound_attempts(tmp_path: Path, run_traced: Any) -> None:
    """The CLI tests' offline assertions mean something only if the watch reports a real attempt."""
    script = "const s=require('net').connect(9,'192.0.2.1');s.on('error',()=>{});setTimeout(()=>process.exit(0),300)"
    with LocalSandbox(parent_dir=tmp_path) as box:
        spec = LaunchSpec(argv=["node", "-e", script], env={}, files={}, cwd=box.workdir)
        command, outbound = run_traced(box, spec, 30)
    if outbound is None:
        pytest.skip("strace cannot trace here")
    assert command.exit_code == 0
    assert outbound == ["192.0.2.1"]
