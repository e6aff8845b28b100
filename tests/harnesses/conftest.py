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
    """The project's node prefix with both pinned CLIs installed (installs them once if needed)."""
    ensure_installed(["pi", "opencode"])
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
