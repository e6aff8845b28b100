"""The doctor: installed or not, which version, does it run -- and what to do when not."""

from __future__ import annotations

from pathlib import Path

import pytest

from openenv_harness.harnesses import doctor as doctor_module
from openenv_harness.harnesses.doctor import doctor
from openenv_harness.harnesses.registry import preset_names


def test_nothing_installed(tmp_path: Path) -> None:
    statuses = {s.name: s for s in doctor(prefix=tmp_path)}
    expected = {"pi", "opencode", "codex", "claude-code", "gemini-cli", "grok-cli", "continue", "mini-swe-agent", "qwen-code", "kilo", "cline"}
    assert set(statuses) == set(preset_names()) and expected <= set(statuses)
    for name, status in statuses.items():
        assert not status.ok and not status.installed and not status.runs and status.version is None
        assert f"python -m openenv_harness.harnesses.install {name}" in status.message
    assert doctor_module.main(["--prefix", str(tmp_path)]) == 1


def test_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="unknown harness"):
        doctor(["nope"], prefix=tmp_path)


@pytest.mark.cli
def test_installed_clis_run(node_prefix: Path) -> None:
    statuses = doctor(prefix=node_prefix)
    assert [(s.name, s.ok, s.version, s.message) for s in statuses] == [
        ("claude-code", True, "2.1.332", "ok"),
        ("cline", True, "3.0.65", "ok"),
        ("codex", True, "0.171.0", "ok"),
        ("continue", True, "1.5.47", "ok"),
        ("gemini-cli", True, "0.61.0", "ok"),
        ("grok-cli", True, "0.0.34", "ok"),
        ("kilo", True, "7.7.7", "ok"),
        ("mini-swe-agent", True, "2.4.6", "ok"),
        ("opencode", True, "1.18.33", "ok"),
        ("pi", True, "0.73.1", "ok"),
        ("qwen-code", True, "0.24.4", "ok"),
    ]
    assert doctor_module.main(["pi", "--prefix", str(node_prefix)]) == 0


@pytest.mark.cli
def test_broken_launcher_is_named(broken_opencode_prefix: Path) -> None:
    [status] = doctor(["opencode"], prefix=broken_opencode_prefix)
    assert status.installed and not status.runs and not status.ok
    assert "postinstall script was not run" in status.message
    assert "python -m openenv_harness.harnesses.install opencode" in status.message


@pytest.mark.cli
def test_claude_code_without_its_native_binary_is_named(broken_claude_prefix: Path) -> None:
    [status] = doctor(["claude-code"], prefix=broken_claude_prefix)
    assert status.installed and not status.runs and not status.ok
    assert "does not run" in status.message
    assert "python -m openenv_harness.harnesses.install claude-code" in status.message


@pytest.mark.cli
def test_missing_node_is_named(node_prefix: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    [status] = doctor(["pi"], prefix=node_prefix)
    assert status.installed and not status.runs
    assert "node is not on PATH" in status.message
