"""LocalSandbox: real subprocesses, real process groups, real files."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from openenv_harness.sandbox import LocalSandbox, SandboxError
from openenv_harness.sandbox.proctree import MARKER_ENV


def _alive(pid: int) -> bool:
    """A process counts as alive unless it is gone or a zombie (dead, waiting to be reaped)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return raw[raw.rfind(")") + 2 :].split()[0] not in ("Z", "X")


def _wait_for_file(box: LocalSandbox, name: str, timeout_s: float = 10.0) -> str:
    path = Path(box.workdir) / name
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.02)
    raise AssertionError(f"{name} never appeared")


@pytest.fixture
def box(tmp_path: Path) -> Iterator[LocalSandbox]:
    sandbox = LocalSandbox(node_prefix=tmp_path / "prefix", kill_grace_s=0.5)
    with sandbox:
        yield sandbox


def test_layout_and_removal(tmp_path: Path) -> None:
    sandbox = LocalSandbox(parent_dir=tmp_path)
    with pytest.raises(SandboxError, match="not started"):
        _ = sandbox.workdir
    with sandbox:
        root = Path(sandbox.root)
        assert root.parent == tmp_path.resolve()
        assert Path(sandbox.workdir).is_dir() and Path(sandbox.home).is_dir()
        assert Path(sandbox.workdir).parent == root and Path(sandbox.home).parent == root
    assert not root.exists()


def test_keep_leaves_the_root(tmp_path: Path) -> None:
    with LocalSandbox(parent_dir=tmp_path, keep=True) as sandbox:
        sandbox.write_file("kept.txt", "still here")
    assert (Path(sandbox.workdir) / "kept.txt").read_text() == "still here"


def test_files_round_trip_and_stay_inside(box: LocalSandbox) -> None:
    box.write_file("a/b/c.txt", "hé")
    assert box.read_file("a/b/c.txt") == "hé".encode()
    home_file = os.path.join(box.home, ".config", "tool", "x.json")
    box.write_file(home_file, b"{}", mode=0o600)
    assert Path(home_file).read_bytes() == b"{}"
    assert Path(home_file).stat().st_mode & 0o777 == 0o600
    with pytest.raises(SandboxError, match="outside the sandbox"):
        box.write_file("../../escaped.txt", "no")
    with pytest.raises(SandboxError, match="outside the sandbox"):
        box.write_file("/etc/openenv-harness-should-not-exist", "no")
    os.symlink("/etc", os.path.join(box.workdir, "link"))
    with pytest.raises(SandboxError, match="outside the sandbox"):
        box.read_file("link/passwd")
    with pytest.raises(SandboxError, match="cannot read"):
        box.read_file("missing.txt")


def test_run_basics(box: LocalSandbox) -> None:
    result = box.run(["sh", "-c", "pwd; echo err >&2; exit 3"])
    assert result.exit_code == 3
    assert result.stdout.strip() == box.workdir
    assert result.stderr.strip() == "err"
    assert not result.timed_out
    echoed = box.run("cat", stdin="exact\n input")
    assert echoed.stdout == "exact\n input" and echoed.exit_code == 0
    box.write_file("sub/.keep", "")
    assert box.run("pwd", cwd="sub").stdout.strip() == os.path.join(box.workdir, "sub")
    assert box.run("cat", timeout_s=5).stdout == ""  # stdin is /dev/null, never the parent's


def test_environment_is_clean(box: LocalSandbox, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-parent-secret")
    monkeypatch.setenv("HF_TOKEN", "hf_parent_secret")
    result = box.run(["env"], env={"TASK_VAR": "given", MARKER_ENV: "caller-cannot-change-it"})
    env = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert "sk-parent-secret" not in result.stdout and "hf_parent_secret" not in result.stdout
    assert env["TASK_VAR"] == "given"
    assert env["HOME"] == box.home
    assert env["XDG_CONFIG_HOME"].startswith(box.home) and env["XDG_DATA_HOME"].startswith(box.home)
    assert env["TMPDIR"].startswith(box.root)
    assert env["PATH"].split(os.pathsep)[:2] == [str(tmp_path / "prefix" / "node_modules" / ".bin"),
                                                 str(tmp_path / "prefix" / "venvs" / ".bin")]
    assert env[MARKER_ENV] == box.sandbox_id
    allowed = {"PATH", "LANG", "HOME", "TMPDIR", "TASK_VAR", MARKER_ENV}
    assert {k for k in env if not k.startswith("XDG_")} <= allowed


def test_run_timeout_kills_the_whole_group(box: LocalSandbox) -> None:
    started = time.monotonic()
    result = box.run("sleep 300 & echo $! > grandchild.pid; wait", timeout_s=1.0)
    assert result.timed_out and result.exit_code is None
    assert time.monotonic() - started < 8
    grandchild = int(box.read_file("grandchild.pid"))
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_start_captures_output_and_feeds_stdin(box: LocalSandbox) -> None:
    proc = box.start("cat > got.txt; echo out; echo err >&2", stdin="line one\nline two", name="agent")
    assert proc.wait(timeout_s=10) == 0
    assert box.read_file("got.txt") == b"line one\nline two"
    assert Path(proc.stdout_path).read_text() == "out\n"
    assert Path(proc.stderr_path).read_text() == "err\n"
    assert Path(proc.stdout_path).parent == Path(box.logs_dir)


def test_background_wait_timeout_and_kill(box: LocalSandbox) -> None:
    proc = box.start(["sleep", "300"])
    assert proc.wait(timeout_s=0.2) is None and proc.poll() is None
    proc.kill()
    assert proc.poll() is not None
    assert not _alive(proc.pid)


def test_close_kills_grandchildren_and_stubborn_processes(tmp_path: Path) -> None:
    sandbox = LocalSandbox(parent_dir=tmp_path, kill_grace_s=0.3)
    sandbox.start_sandbox()
    leader = sandbox.start("sleep 300 & echo $! > child.pid; sleep 300")
    stubborn = sandbox.start("trap '' TERM; echo $$ > stubborn.pid; while :; do sleep 0.1; done")
    child = int(_wait_for_file(sandbox, "child.pid"))
    stubborn_pid = int(_wait_for_file(sandbox, "stubborn.pid"))
    assert _alive(child) and _alive(stubborn_pid) and _alive(leader.pid)
    started = time.monotonic()
    sandbox.close()
    assert time.monotonic() - started < 8
    for pid in (child, stubborn_pid, leader.pid, stubborn.pid):
        assert not _alive(pid), pid
    assert not Path(tmp_path).joinpath(os.path.basename(sandbox.root)).exists()


def test_tool_processes_in_their_own_session_are_killed_too(tmp_path: Path) -> None:
    """Agents run shell tools under setsid; what those start must not outlive the sandbox."""
    sandbox = LocalSandbox(parent_dir=tmp_path, kill_grace_s=0.3)
    sandbox.start_sandbox()
    # A child in its own session whose parent stays alive: found as a descendant by kill().
    attached = sandbox.start("setsid sh -c 'echo $$ > attached.pid; sleep 300' & sleep 300")
    attached_pid = int(_wait_for_file(sandbox, "attached.pid"))
    attached.kill()
    assert not _alive(attached_pid)
    # Orphaned and in its own session: only the environment marker still ties it to the sandbox.
    sandbox.run("setsid sh -c 'echo $$ > orphan.pid; exec sleep 300' > /dev/null 2>&1 < /dev/null &")
    orphan = int(_wait_for_file(sandbox, "orphan.pid"))
    assert _alive(orphan)
    sandbox.close()
    assert not _alive(orphan)


def test_close_is_idempotent_and_final(tmp_path: Path) -> None:
    sandbox = LocalSandbox(parent_dir=tmp_path)
    sandbox.close()  # never started: nothing to do
    sandbox = LocalSandbox(parent_dir=tmp_path)
    sandbox.start_sandbox()
    sandbox.start_sandbox()  # idempotent
    sandbox.close()
    sandbox.close()
    with pytest.raises(SandboxError, match="closed"):
        sandbox.run(["true"])
    with pytest.raises(SandboxError, match="closed"):
        sandbox.start_sandbox()


def test_model_endpoint_is_unchanged(box: LocalSandbox) -> None:
    endpoint = box.model_endpoint("http://127.0.0.1:8000/rollout/s1/v1", "sk-key")
    assert endpoint.base_url == "http://127.0.0.1:8000/rollout/s1/v1"
    assert endpoint.api_key == "sk-key"
    assert endpoint.extra_headers == {}


def test_bad_command_is_a_clear_error(box: LocalSandbox) -> None:
    with pytest.raises(SandboxError, match="cannot start"):
        box.run(["/nonexistent/binary"])
    with pytest.raises(SandboxError, match="empty command"):
        box.run([])
