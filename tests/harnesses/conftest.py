"""Shared fixtures for the preset tests: the scripted engine and the installed CLIs."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from openenv_harness.harnesses.base import LaunchSpec
from openenv_harness.harnesses.install import default_node_prefix, ensure_installed
from openenv_harness.sandbox import CommandResult, LocalSandbox

_HERE = Path(__file__).parent


def _load_stub_module() -> Any:
    """Import stub_engine.py by path, so it works under any pytest import mode."""
    name = "openenv_harness_tests_stub_engine"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _HERE / "stub_engine.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def stub_engine() -> Iterator[Callable[..., Any]]:
    """Factory: ``stub_engine(tool_command=..., final_text=..., api_key=...)`` -> a running StubEngine."""
    module = _load_stub_module()
    started: list[Any] = []

    def make(**kwargs: Any) -> Any:
        engine = module.StubEngine(**kwargs)
        engine.__enter__()
        started.append(engine)
        return engine

    yield make
    for engine in started:
        engine.__exit__(None, None, None)


@pytest.fixture(scope="session")
def node_prefix() -> Path:
    """The project's node prefix with every pinned CLI installed (installs them once if needed)."""
    ensure_installed()
    return default_node_prefix()


@pytest.fixture(scope="session")
def captured_calls() -> list[dict[str, Any]]:
    """First system prompts and tool lists of requests captured from the real CLIs."""
    return json.loads((_HERE / "data" / "captured_calls.json").read_text())


@pytest.fixture
def sandbox(node_prefix: Path, tmp_path: Path) -> Iterator[LocalSandbox]:
    """A fresh local sandbox whose PATH starts with the installed CLIs."""
    with LocalSandbox(node_prefix=node_prefix, parent_dir=tmp_path) as box:
        yield box


def _strace_works(strace: str | None) -> bool:
    if strace is None:
        return False
    probe = subprocess.run([strace, "-f", "-qq", "-e", "trace=connect", "-o", os.devnull, "true"], capture_output=True)
    return probe.returncode == 0


_ADDRESS = re.compile(r'(?:inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)")')
_PORT = re.compile(r"sin6?_port=htons\((\d+)\)")


def inet_connects(trace: str) -> list[tuple[str, int]]:
    """``(address, port)`` of every AF_INET/AF_INET6 connect() in an strace log, loopback included."""
    found = []
    for line in trace.splitlines():
        if "connect(" not in line or "AF_INET" not in line:
            continue
        address, port = _ADDRESS.search(line), _PORT.search(line)
        found.append(((address.group(1) or address.group(2)) if address else line.strip(),
                      int(port.group(1)) if port else -1))
    return found


def _non_loopback(trace: str) -> list[str]:
    """Addresses of AF_INET/AF_INET6 connect() calls in an strace log that are not loopback."""
    outbound = []
    for line in trace.splitlines():
        if "connect(" not in line or "AF_INET" not in line:
            continue
        match = _ADDRESS.search(line)
        address = (match.group(1) or match.group(2)) if match else line.strip()
        if not (address.startswith("127.") or address in ("::1", "::ffff:127.0.0.1")):
            outbound.append(address)
    return outbound


@pytest.fixture(scope="session")
def run_traced() -> Callable[[LocalSandbox, LaunchSpec, float], tuple[CommandResult, list[str] | None]]:
    """Run a launch spec in a sandbox, under ``strace -e connect`` when strace works here.

    Returns the command result and the non-loopback addresses the process tree tried to connect
    to (``None`` when strace is unavailable, so callers know nothing was observed).
    """
    strace = shutil.which("strace")
    usable = _strace_works(strace)

    def run(box: LocalSandbox, spec: LaunchSpec, timeout_s: float) -> tuple[CommandResult, list[str] | None]:
        if not usable:
            return box.run(spec.argv, env=spec.env, cwd=spec.cwd, stdin=spec.stdin, timeout_s=timeout_s), None
        log = os.path.join(box.logs_dir, "connect.trace")
        argv = [str(strace), "-f", "-qq", "-e", "trace=connect", "-o", log, *spec.argv]
        result = box.run(argv, env=spec.env, cwd=spec.cwd, stdin=spec.stdin, timeout_s=timeout_s)
        return result, _non_loopback(Path(log).read_text())

    return run


@pytest.fixture(scope="session")
def run_connects() -> Callable[[LocalSandbox, LaunchSpec, float], tuple[CommandResult, list[tuple[str, int]] | None]]:
    """Like ``run_traced``, but returns every inet connect() with its port (None without strace)."""
    strace = shutil.which("strace")
    usable = _strace_works(strace)

    def run(box: LocalSandbox, spec: LaunchSpec, timeout_s: float) -> tuple[CommandResult, list[tuple[str, int]] | None]:
        if not usable:
            return box.run(spec.argv, env=spec.env, cwd=spec.cwd, stdin=spec.stdin, timeout_s=timeout_s), None
        log = os.path.join(box.logs_dir, "connect.trace")
        argv = [str(strace), "-f", "-qq", "-e", "trace=connect", "-o", log, *spec.argv]
        result = box.run(argv, env=spec.env, cwd=spec.cwd, stdin=spec.stdin, timeout_s=timeout_s)
        return result, inet_connects(Path(log).read_text())

    return run


@pytest.fixture(scope="module")
def recording_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, Any]]:
    """The reference engine and a recorder in front of it, for the CLIs that only speak a dialect."""
    from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
    from openenv_harness.testing.engine import EngineServer

    admin_token = "harness-tests-admin-0123456789"
    store = tmp_path_factory.mktemp("recorder") / "records.db"
    with EngineServer() as engine:
        config = RecorderConfig(store_path=str(store), engine_url=engine.url, admin_token=admin_token)
        with RecorderServer(config) as recorder, RecorderClient(recorder.url, admin_token) as admin:
            yield engine, recorder, admin


@pytest.fixture
def broken_opencode_prefix(node_prefix: Path, tmp_path: Path) -> Path:
    """A copy of the installed prefix as ``npm install --ignore-scripts`` leaves it for OpenCode.

    The copy hard-links the 560 MB tree (cheap, same filesystem); every file this test or npm may
    rewrite is a real copy or a fresh inode, so the shared prefix is never written through.
    """
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    subprocess.run(["cp", "-al", str(node_prefix / "node_modules"), str(prefix)], check=True)
    for name in ("package.json", "package-lock.json"):
        if (node_prefix / name).exists():
            shutil.copyfile(node_prefix / name, prefix / name)
    hidden_lock = prefix / "node_modules" / ".package-lock.json"
    if hidden_lock.exists():
        hidden_lock.unlink()
        shutil.copyfile(node_prefix / "node_modules" / ".package-lock.json", hidden_lock)
    launcher = prefix / "node_modules" / "opencode-ai" / "bin" / "opencode.exe"
    launcher.unlink()
    launcher.write_text('#!/bin/sh\necho "postinstall script was not run" >&2\nexit 1\n')
    launcher.chmod(0o755)
    return prefix


@pytest.fixture
def broken_claude_prefix(node_prefix: Path, tmp_path: Path) -> Path:
    """A copy of the installed prefix as ``npm install --ignore-scripts`` leaves Claude Code: the
    package's ``bin/claude.exe`` is its shell stub, the platform package's binary sits unused.

    Hard links keep the copy cheap (the binary is ~400 MB); the stub is a fresh file, so the shared
    prefix is never written through.
    """
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    subprocess.run(["cp", "-al", str(node_prefix / "node_modules"), str(prefix)], check=True)
    launcher = prefix / "node_modules" / "@anthropic-ai" / "claude-code" / "bin" / "claude.exe"
    launcher.unlink()
    # like the package's own stub: shell lines without a "#!" line (exec() refuses it; a shell runs it)
    launcher.write_text('echo "Error: claude native binary not installed." >&2\necho "Run the postinstall" >&2\nexit 1\n')
    launcher.chmod(0o755)
    return prefix
