"""What an agent's shell tool cannot do from a container sandbox, tried for real.

Each attempt is a shell command run through ``sandbox.run`` (as an agent's shell tool runs one),
and then the host is checked from outside: its files, its loopback listener, its processes, its
free disk space.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_container import (
    box,  # noqa: F401  (fixture)
    container_id,
    containers_named,
    engine_cli,
    host_pids_in_container,
    host_pids_running,
    new_sandbox,
)

from openenv_harness.sandbox.base import CommandResult
from openenv_harness.sandbox.container import ContainerLimits, ContainerSandbox


def test_host_home_is_out_of_sight(box: ContainerSandbox) -> None:
    secret = f"host-secret-{uuid.uuid4().hex}"
    planted = Path.home() / f".oeh-escape-{uuid.uuid4().hex[:12]}"
    planted.write_text(secret)
    try:
        read = box.run(f"cat {planted}", timeout_s=30)
        listed = box.run(f"ls -a /root {Path.home()}", timeout_s=30)
        found = box.run(rf"find / \( -path /proc -o -path /sys \) -prune -o -name {planted.name} -print",
                        timeout_s=60)
        assert planted.read_text() == secret  # still there on the host, where the test can read it
    finally:
        planted.unlink()
    assert read.exit_code != 0 and secret not in read.stdout + read.stderr, read
    assert planted.name not in listed.stdout, listed
    assert found.stdout == "", found


def test_writes_outside_the_workdir_leave_the_host_unchanged(box: ContainerSandbox) -> None:
    assert box.host_dir is not None
    relay_on_host = Path(box.host_dir, "relay")
    prefix_on_host = Path(box.node_prefix)
    relay_before, prefix_before = sorted(os.listdir(relay_on_host)), sorted(os.listdir(prefix_on_host))
    name = f"oeh-escape-{uuid.uuid4().hex[:12]}"
    host_tmp = Path(tempfile.gettempdir(), name)

    # /tmp inside is the container's own small tmpfs: the write lands there, never in the host's /tmp
    tmp = box.run(f"echo escaped > {host_tmp} && cat {host_tmp}")
    assert tmp.exit_code == 0 and tmp.stdout == "escaped\n", tmp
    assert not host_tmp.exists()

    targets = {
        "etc": f"/etc/{name}",
        "prefix": f"{prefix_on_host}/{name}",
        "relay": f"/oeh/relay/{name}",
        "relay by its host path": f"{relay_on_host}/{name}",
    }
    for what, target in targets.items():
        result = box.run(f"echo escaped > {target}")
        assert result.exit_code != 0, (what, result)
        refusals = ("Read-only file system", "Permission denied", "nonexistent", "No such file")
        assert any(why in result.stderr for why in refusals), (what, result)
    assert not Path("/etc", name).exists()
    assert sorted(os.listdir(prefix_on_host)) == prefix_before
    assert sorted(os.listdir(relay_on_host)) == relay_before


def test_the_relay_link_directory_takes_no_writes_once_linked(box: ContainerSandbox) -> None:
    """The link directory is the one host directory mounted writable (the relay makes its socket
    there); once the relay is linked it is read-only to the container, so nothing the agent writes
    reaches the host's disk past the sandbox's own limit."""
    assert box.host_dir is not None
    box.model_endpoint("http://127.0.0.1:9/rollout/r-escape/v1", "key")  # the relay up and linked
    link_on_host = Path(box.host_dir, "link")
    assert sorted(os.listdir(link_on_host)) == ["trainer.sock"]
    for command in ("echo escaped > /oeh/link/x", "mkdir /oeh/link/d", "rm -f /oeh/link/trainer.sock",
                    "dd if=/dev/zero of=/oeh/link/big bs=1M count=4"):
        result = box.run(command)
        assert result.exit_code != 0 and "Permission denied" in result.stderr, (command, result)
    assert sorted(os.listdir(link_on_host)) == ["trainer.sock"]


class LoopbackListener:
    """A TCP server on the host's 127.0.0.1 that records every connection it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.port: int = self.sock.getsockname()[1]
        self.accepted: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(peer)
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[LoopbackListener]:
    server = LoopbackListener()
    try:
        yield server
    finally:
        server.close()


def _wait_accepted(listener: LoopbackListener, count: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(listener.accepted) < count and time.monotonic() < deadline:
        time.sleep(0.02)


def test_host_loopback_is_unreachable(box: ContainerSandbox, listener: LoopbackListener) -> None:
    socket.create_connection(("127.0.0.1", listener.port), timeout=5).close()  # the listener does record
    _wait_accepted(listener, 1)
    assert len(listener.accepted) == 1
    connect = (f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {listener.port}), timeout=3); "
               "print('connected')\"")
    result = box.run(connect, timeout_s=30)
    assert result.exit_code != 0 and "connected" not in result.stdout, result
    assert "ConnectionRefusedError" in result.stderr, result
    time.sleep(0.3)
    assert len(listener.accepted) == 1, listener.accepted
    interfaces = box.run("cat /proc/net/dev").stdout.splitlines()[2:]
    assert [line.split(":")[0].strip() for line in interfaces] == ["lo"], interfaces


#: Every process forks until it has forked 9 times, retrying while the kernel refuses, then stays:
#: up to 2**9 processes, so a pid limit that no longer holds fails the test without taking the host
#: down; each one exits by itself after 30 s whatever happens.
_FORK_BOMB = """python3 -c '
import os, time
end, forks = time.monotonic() + 30, 0
while forks < 9 and time.monotonic() < end:
    try:
        os.fork()
        forks += 1
    except OSError:
        time.sleep(0.05)
while time.monotonic() < end:
    time.sleep(0.5)
'"""


def pids_cgroup(sandbox: ContainerSandbox) -> Path:
    """The host's directory of the container's pids cgroup (cgroup v1 or v2)."""
    init_pid = engine_cli("inspect", "--format", "{{.State.Pid}}", sandbox.container_name).strip()
    lines = Path(f"/proc/{init_pid}/cgroup").read_text().splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return Path("/sys/fs/cgroup/pids" + path)
    unified = [line.split(":", 2)[2] for line in lines if line.startswith("0::")]
    assert unified, lines
    return Path("/sys/fs/cgroup" + unified[0])


@pytest.mark.slow
def test_fork_bomb_is_held_by_the_pid_limit(container_image: str, tmp_path: Path) -> None:
    sandbox = new_sandbox(container_image, tmp_path, ContainerLimits(pids=64, cpus=1.0))
    sandbox.start_sandbox()
    try:
        full_id = container_id(sandbox)
        cgroup = pids_cgroup(sandbox)
        assert (cgroup / "pids.max").read_text().strip() == "64"
        host_before = len(os.listdir("/proc"))
        outcome: list[CommandResult] = []
        bomb = threading.Thread(target=lambda: outcome.append(sandbox.run(_FORK_BOMB, timeout_s=3.0)))
        bomb.start()
        in_container, on_host, slowest_spawn = 0, 0, 0.0
        while bomb.is_alive():
            in_container = max(in_container, int((cgroup / "pids.current").read_text()))
            on_host = max(on_host, len(os.listdir("/proc")))
            started = time.monotonic()
            subprocess.run(["true"], check=True, timeout=30)
            slowest_spawn = max(slowest_spawn, time.monotonic() - started)
            time.sleep(0.1)
        bomb.join()
        result = outcome[0]
        assert result.timed_out, result
        # it did run, and never forked past the limit (the engine moves its own `exec` processes into
        # the cgroup, which the limit does not refuse: a few over it while one starts)
        assert 40 <= in_container <= 64 + 16, in_container
        assert slowest_spawn < 5.0, slowest_spawn  # the host still starts processes
        assert on_host - host_before < 64 + 200, (host_before, on_host)
    finally:
        sandbox.close()
    assert host_pids_in_container(full_id) == []
    assert containers_named(sandbox.container_name) == []


def _free_bytes(paths: list[str]) -> dict[int, int]:
    """Free bytes per distinct filesystem among ``paths``."""
    return {os.stat(path).st_dev: shutil.disk_usage(path).free for path in paths}


def test_filling_the_disk_stops_at_the_limit(container_image: str, tmp_path: Path) -> None:
    with new_sandbox(container_image, tmp_path, ContainerLimits(disk="32m")) as sandbox:
        assert sandbox.host_dir is not None
        watched = ["/", tempfile.gettempdir(), str(Path.home()), sandbox.host_dir]
        docker_root = engine_cli("info", "--format", "{{.DockerRootDir}}").strip()
        if os.path.isdir(docker_root):
            watched.append(docker_root)
        before = _free_bytes(watched)
        filled = sandbox.run("dd if=/dev/zero of=big bs=1M count=100", timeout_s=60)
        after = _free_bytes(watched)
        assert filled.exit_code != 0 and "No space left on device" in filled.stderr, filled
        size = int(sandbox.run("stat -c %s big").stdout)
        assert 16 * 2**20 <= size <= 32 * 2**20, size
        for device, free in before.items():
            assert free - after[device] < 24 * 2**20, (device, free, after[device])  # not the 100 MiB dd asked for
        assert sandbox.run("echo still answering").stdout == "still answering\n"
        assert sandbox.run("rm big").exit_code == 0
        sandbox.write_file("after.txt", "room again")
        assert sandbox.read_file("after.txt") == b"room again"


def test_nothing_outlives_close(container_image: str, tmp_path: Path) -> None:
    tag = f"1234.{uuid.uuid4().int % 10**8:08d}"  # `sleep 1234.<n>`: found on the host by this run's own n
    detached, daemon = f"sleep {tag}1", f"sleep {tag}2"
    double_fork = (
        "python3 -c 'import os, sys\n"
        "if os.fork(): sys.exit(0)\n"
        "os.setsid()\n"
        "if os.fork(): sys.exit(0)\n"
        f"os.execvp(\"sleep\", \"{daemon}\".split())'"
    )
    sandbox = new_sandbox(container_image, tmp_path)
    sandbox.start_sandbox()
    host_dir = sandbox.host_dir
    assert host_dir is not None
    try:
        full_id = container_id(sandbox)
        started = sandbox.run(f"setsid nohup {detached} >/dev/null 2>&1 & {double_fork} </dev/null >/dev/null 2>&1",
                              timeout_s=30)
        assert started.exit_code == 0, started
        deadline = time.monotonic() + 10
        alive: list[int] = []
        while len(alive) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = host_pids_running(detached, exact=True) + host_pids_running(daemon, exact=True)
        assert len(alive) == 2, alive  # the host does see them, as long as the container runs
        assert set(alive) <= set(host_pids_in_container(full_id))
    finally:
        sandbox.close()
    assert host_pids_running(detached) == [] and host_pids_running(daemon) == []
    assert host_pids_in_container(full_id) == []
    assert containers_named(sandbox.container_name) == []
    assert not Path(host_dir).exists()
    assert engine_cli("ps", "-a", "--filter", f"id={full_id}", "--format", "{{.ID}}").strip() == ""
