"""ContainerSandbox: a real container of the default image, real commands, real files.

The helpers at the top look at the host from outside the container (the engine's own listing, the
host's ``/proc``); ``test_container_escapes`` and ``test_container_reaper`` use them too.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from openenv_harness.sandbox import SandboxError
from openenv_harness.sandbox.container import ContainerLimits, ContainerSandbox
from openenv_harness.sandbox.container_engine import require_container_engine


def engine_cli(*args: str) -> str:
    """``<engine> *args``'s stdout (the same engine the sandbox picks)."""
    return require_container_engine().run_cli(list(args)).stdout.decode()


def containers_named(name: str) -> list[str]:
    """The containers (running or not) with exactly this name."""
    return engine_cli("ps", "-a", "--filter", f"name=^/?{name}$", "--format", "{{.Names}}").split()


def container_id(sandbox: ContainerSandbox) -> str:
    return engine_cli("inspect", "--format", "{{.Id}}", sandbox.container_name).strip()


def _host_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def host_pids_in_container(full_id: str) -> list[int]:
    """Host processes whose cgroup is the container's (every process in it, whatever it became)."""
    found = []
    for pid in _host_pids():
        try:
            if full_id in Path(f"/proc/{pid}/cgroup").read_text():
                found.append(pid)
        except OSError:
            continue
    return found


def host_pids_running(needle: str, *, exact: bool = False) -> list[int]:
    """Host processes (zombies aside) whose command line contains ``needle`` (is it, with ``exact``)."""
    found = []
    for pid in _host_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        matches = cmdline.strip() == needle if exact else needle in cmdline
        if matches and pid != os.getpid() and stat[stat.rfind(")") + 2 :].split()[0] not in ("Z", "X"):
            found.append(pid)
    return found


def commands_inside(sandbox: ContainerSandbox) -> list[str]:
    """Every process's command line in the container."""
    result = sandbox.run(["ps", "-eo", "args="], timeout_s=30)
    assert result.exit_code == 0, result
    return [line.strip() for line in result.stdout.splitlines()]


def wait_for_file(sandbox: ContainerSandbox, path: str, timeout_s: float = 15.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            text = sandbox.read_file(path).decode().strip()
        except SandboxError:
            text = ""
        if text:
            return text
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared in the sandbox")


def new_sandbox(image: str, tmp_path: Path, limits: ContainerLimits | None = None) -> ContainerSandbox:
    """A sandbox whose agent prefix is an empty directory of the test's (no installed agents needed)."""
    prefix = tmp_path / "prefix"
    prefix.mkdir(exist_ok=True)
    return ContainerSandbox(image=image, node_prefix=prefix, limits=limits, parent_dir=tmp_path, kill_grace_s=1.0)


@pytest.fixture
def box(container_image: str, tmp_path: Path) -> Iterator[ContainerSandbox]:
    with new_sandbox(container_image, tmp_path) as sandbox:
        yield sandbox


def test_layout_is_private_and_the_root_read_only(box: ContainerSandbox) -> None:
    assert box.workdir.startswith("/sandbox/") and box.home.startswith("/sandbox/")
    result = box.run("pwd; touch ./w $HOME/h /sandbox/tmp/t && echo writable; touch /etc/x; touch /x")
    lines = result.stdout.splitlines()
    assert lines == [box.workdir, "writable"], result
    assert "/etc/x" in result.stderr and "Read-only file system" in result.stderr, result
    assert "'/x'" in result.stderr, result
    assert box.run("test -e /etc/x || test -e /x").exit_code == 1


def test_files_round_trip_with_mode(box: ContainerSandbox) -> None:
    box.write_file("a/b/tool.sh", "#!/bin/sh\necho ran \"$1\"\n", mode=0o750)
    assert box.run("stat -c %a a/b/tool.sh").stdout.strip() == "750"
    assert box.run(["./a/b/tool.sh", "x y"]).stdout == "ran x y\n"
    payload = bytes(range(256)) * 3
    box.write_file(f"{box.home}/.config/blob", payload, mode=0o600)
    assert box.read_file(f"{box.home}/.config/blob") == payload
    assert box.run(f"stat -c %a {box.home}/.config/blob").stdout.strip() == "600"
    box.write_file("a/b/tool.sh", "short")  # overwritten, not appended
    assert box.read_file("a/b/tool.sh") == b"short"
    with pytest.raises(SandboxError, match="cannot read"):
        box.read_file("missing.txt")
    with pytest.raises(SandboxError, match="outside the sandbox root"):
        box.write_file("../../etc/x", "no")


@pytest.mark.parametrize("path", ["../../etc/x", "/etc/passwd", "/tmp/x", "/sandbox/../root/x", "/sandboxes/x", "/"])
def test_paths_outside_the_sandbox_are_refused(tmp_path: Path, path: str) -> None:
    """Refused before anything runs: no container needed."""
    sandbox = ContainerSandbox(node_prefix=tmp_path)
    with pytest.raises(SandboxError, match="outside the sandbox root"):
        sandbox.write_file(path, "no")
    with pytest.raises(SandboxError, match="outside the sandbox root"):
        sandbox.read_file(path)


def test_run_basics(box: ContainerSandbox) -> None:
    result = box.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (3, "out\n", "err\n", False)
    echoed = box.run("cat", stdin="exact\n input é")
    assert echoed.stdout == "exact\n input é" and echoed.exit_code == 0
    assert box.run("cat", timeout_s=10).stdout == ""  # stdin is /dev/null, never the caller's
    box.write_file("sub/.keep", "")
    assert box.run("pwd", cwd="sub").stdout.strip() == f"{box.workdir}/sub"
    assert box.run("echo $GIVEN", env={"GIVEN": "a value"}).stdout == "a value\n"


def test_run_timeout_stops_the_command_and_its_children(box: ContainerSandbox) -> None:
    started = time.monotonic()
    result = box.run("setsid sleep 987 & sleep 986 & wait", timeout_s=1.0)
    assert result.timed_out and result.exit_code is None
    assert time.monotonic() - started < 10
    left = commands_inside(box)
    assert not [line for line in left if line.startswith(("sleep 987", "sleep 986"))], left
    assert box.run("echo still here").stdout == "still here\n"


def test_background_process_poll_wait_kill(box: ContainerSandbox) -> None:
    done = box.start("cat; echo err >&2; exit 4", stdin="fed to it", name="agent")
    assert done.wait(timeout_s=20) == 4 and done.poll() == 4
    assert done.stdout_path.startswith(f"{box.logs_dir}/agent-")
    assert box.read_file(done.stdout_path) == b"fed to it"
    assert box.read_file(done.stderr_path) == b"err\n"

    proc = box.start("setsid sh -c 'echo $$ > grandchild.pid; exec sleep 988' & exec sleep 989")
    grandchild = wait_for_file(box, "grandchild.pid")
    assert proc.poll() is None and proc.wait(timeout_s=0.2) is None
    sessions = dict(line.split(None, 1)[::-1] for line in box.run("ps -eo sid=,args=").stdout.splitlines())
    assert sessions["sleep 988"] == grandchild != sessions["sleep 989"], sessions  # a session of its own
    proc.kill()
    assert proc.poll() is not None
    left = commands_inside(box)
    assert not [line for line in left if line.startswith(("sleep 988", "sleep 989"))], left


def test_environment_has_nothing_of_the_host(box: ContainerSandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    name, value = f"OEH_HOST_ONLY_{uuid.uuid4().hex[:8].upper()}", f"host-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv(name, value)
    result = box.run("env")
    assert result.exit_code == 0
    assert name not in result.stdout and value not in result.stdout
    env = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert env["HOME"] == box.home and env["TMPDIR"].startswith("/sandbox/")
    assert env["XDG_CONFIG_HOME"].startswith(box.home)
    expected = set(box.environment()) | {"OEH_COMMAND", "HOSTNAME", "PWD"}
    assert set(env) <= expected, set(env) - expected


def test_commands_run_unprivileged(box: ContainerSandbox) -> None:
    result = box.run("id -u; id -g; grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs):' /proc/self/status")
    lines = result.stdout.split("\n")
    assert lines[:2] == ["1000", "1000"], result
    fields = dict(line.split(":\t") for line in lines[2:] if line)
    assert int(fields["CapEff"], 16) == 0 and int(fields["CapPrm"], 16) == 0 and int(fields["CapBnd"], 16) == 0
    assert fields["NoNewPrivs"] == "1"
    assert box.run("cat /etc/shadow").exit_code != 0


def test_close_removes_the_container_and_its_host_dir(container_image: str, tmp_path: Path) -> None:
    sandbox = new_sandbox(container_image, tmp_path)
    sandbox.close()  # never started: nothing to do
    sandbox = new_sandbox(container_image, tmp_path)
    sandbox.start_sandbox()
    sandbox.start_sandbox()  # idempotent
    host_dir = sandbox.host_dir
    assert host_dir is not None and Path(host_dir, "relay").is_dir()
    assert containers_named(sandbox.container_name) == [sandbox.container_name]
    sandbox.start("sleep 300")
    sandbox.close()
    assert containers_named(sandbox.container_name) == []
    assert not Path(host_dir).exists()
    sandbox.close()  # twice is safe
    with pytest.raises(SandboxError, match="closed"):
        sandbox.run(["true"])
    with pytest.raises(SandboxError, match="closed"):
        sandbox.start_sandbox()


def test_missing_image_is_a_clear_error(container_image: str, tmp_path: Path) -> None:
    image = f"openenv-harness/sandbox:absent-{uuid.uuid4().hex[:12]}"
    sandbox = new_sandbox(image, tmp_path)
    with pytest.raises(SandboxError) as raised:
        sandbox.start_sandbox()
    message = str(raised.value)
    assert image in message
    assert f"python -m openenv_harness.sandbox.container_image --tag {image}" in message
    assert containers_named(sandbox.container_name) == []
    assert sandbox.host_dir is not None and not Path(sandbox.host_dir).exists()


def test_infrastructure_faults_name_a_container_stopped_from_outside(box: ContainerSandbox) -> None:
    assert box.infrastructure_faults() == []
    assert box.run("true").exit_code == 0
    assert box.infrastructure_faults() == []
    engine_cli("kill", box.container_name)
    faults = box.infrastructure_faults()
    assert len(faults) == 1 and box.container_name in faults[0], faults
    assert "running" not in faults[0]
