"""The reaper: containers whose owning process was killed are removed at the next process's first sandbox."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_container import containers_named, engine_cli, new_sandbox

from openenv_harness.sandbox import container
from openenv_harness.sandbox.container_reaper import OWNER_LABEL, owner_alive, process_start_ticks, this_owner

_OWNER_SCRIPT = textwrap.dedent("""
    import sys, time
    from openenv_harness.sandbox.container import ContainerSandbox

    sandbox = ContainerSandbox(image=sys.argv[1], node_prefix=sys.argv[2], parent_dir=sys.argv[3])
    sandbox.start_sandbox()
    print(sandbox.container_name, sandbox.host_dir, flush=True)
    time.sleep(600)
""")


def test_orphans_of_a_killed_owner_are_reaped(container_image: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    # a sandbox of this (live) process, started before: the reaper must leave it alone
    with new_sandbox(container_image, tmp_path) as keeper:
        owner = subprocess.Popen([sys.executable, "-c", _OWNER_SCRIPT, container_image, str(prefix), str(tmp_path)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = owner.stdout.readline() if owner.stdout else ""
            assert line, owner.stderr.read() if owner.stderr else "no output"
            orphan_name, orphan_dir = line.split()
        finally:
            os.kill(owner.pid, signal.SIGKILL)
            owner.wait(30)
        assert owner.returncode == -signal.SIGKILL
        # killed with SIGKILL, the owner removed nothing: its container and host directory are still there
        assert containers_named(orphan_name) == [orphan_name]
        assert Path(orphan_dir).is_dir()
        label = engine_cli("inspect", "--format", f'{{{{index .Config.Labels "{OWNER_LABEL}"}}}}', orphan_name).strip()
        assert label.split(":")[1] == str(owner.pid) and not owner_alive(label)

        monkeypatch.setattr(container, "_reaped", set())  # this process's first sandbox, again
        with new_sandbox(container_image, tmp_path) as fresh:
            assert fresh.run("echo fresh").stdout == "fresh\n"
        assert containers_named(orphan_name) == []
        assert not Path(orphan_dir).exists()
        assert containers_named(keeper.container_name) == [keeper.container_name]
        assert keeper.run("echo kept").stdout == "kept\n"
        assert keeper.infrastructure_faults() == []


def test_owner_alive() -> None:
    host = socket.gethostname()
    assert owner_alive(this_owner())
    assert this_owner() == f"{host}:{os.getpid()}:{process_start_ticks(os.getpid())}"

    child = subprocess.Popen(["sleep", "30"])
    try:
        ticks = process_start_ticks(child.pid)
        assert ticks is not None and owner_alive(f"{host}:{child.pid}:{ticks}")
    finally:
        child.kill()
        child.wait()
    assert not owner_alive(f"{host}:{child.pid}:{ticks}")  # dead (and reaped)

    mine = process_start_ticks(os.getpid())
    assert mine is not None
    assert not owner_alive(f"{host}:{os.getpid()}:{int(mine) + 1}")  # a reused pid: another start time
    assert not owner_alive(f"{host}:not-a-pid:{mine}")
    assert owner_alive(f"not-{host}:1:1")  # another host's process cannot be checked from here: kept
