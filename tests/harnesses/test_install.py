"""Installing the pinned CLIs into the project's node prefix."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from openenv_harness.harnesses import UnknownHarnessError, get_preset, preset_names
from openenv_harness.harnesses import install
from openenv_harness.harnesses.install import PREFIX_ENV, InstallError, default_node_prefix, ensure_installed


def _forbid(name: str):  # type: ignore[no-untyped-def]
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{name} must not run when the install is already done")

    return refuse


def test_default_prefix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(PREFIX_ENV, raising=False)
    repo = Path(install.__file__).resolve().parents[2]
    assert default_node_prefix() == repo / ".cache" / "harnesses"
    monkeypatch.setenv(PREFIX_ENV, str(tmp_path / "elsewhere"))
    assert default_node_prefix() == tmp_path / "elsewhere"


def test_unknown_harness_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(UnknownHarnessError, match="claude"):
        ensure_installed(["pi", "claude"], prefix=tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert install.main(["claude", "--prefix", str(tmp_path)]) == 1


@pytest.mark.cli
def test_done_install_is_fast_and_starts_nothing(node_prefix: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(install, "_npm_install", _forbid("npm install"))
    monkeypatch.setattr(install, "probe_version", _forbid("a --version probe"))
    started = time.monotonic()
    paths = ensure_installed(None, prefix=node_prefix)
    assert time.monotonic() - started < 1.0
    assert set(paths) == set(preset_names()) and {"pi", "opencode", "codex", "claude-code", "gemini-cli"} <= set(paths)
    for name, path in paths.items():
        assert path == node_prefix / get_preset(name).binary
        assert os.access(path, os.X_OK)
    assert ensure_installed("pi", prefix=node_prefix) == {"pi": paths["pi"]}  # a single name works too


@pytest.mark.cli
@pytest.mark.slow
def test_repairs_an_install_whose_scripts_did_not_run(
    broken_opencode_prefix: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = broken_opencode_prefix
    paths = ensure_installed(["opencode"], prefix=prefix)  # npm finds it installed; the postinstall repairs
    probe = install.probe_version(get_preset("opencode"), paths["opencode"])
    assert probe.runs and probe.output == "1.18.33"
    # The stamp now short-circuits; without it, a --version probe (never npm) re-verifies.
    monkeypatch.setattr(install, "_npm_install", _forbid("npm install"))
    assert ensure_installed(["opencode"], prefix=prefix) == paths
    (prefix / ".openenv-harness" / "opencode.json").unlink()
    assert ensure_installed(["opencode"], prefix=prefix) == paths


@pytest.mark.cli
def test_claude_codes_native_binary_is_linked_when_npm_ran_no_scripts(
    broken_claude_prefix: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = broken_claude_prefix
    preset = get_preset("claude-code")
    stub = install.probe_version(preset, prefix / preset.binary)
    assert not stub.runs
    npm_runs: list[list[str]] = []
    monkeypatch.setattr(install, "_npm_install", lambda root, specs: npm_runs.append(specs))  # npm that runs no scripts
    paths = ensure_installed(["claude-code"], prefix=prefix)
    assert npm_runs == [["@anthropic-ai/claude-code@2.1.332"]]
    probe = install.probe_version(preset, paths["claude-code"])
    assert probe.runs and probe.output == "2.1.332 (Claude Code)"  # the installer ran install.cjs itself
    monkeypatch.setattr(install, "_npm_install", _forbid("npm install"))
    assert ensure_installed(["claude-code"], prefix=prefix) == paths


def test_npm_failure_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no npm here
    with pytest.raises(InstallError, match="npm is not on PATH"):
        ensure_installed(["pi"], prefix=tmp_path / "prefix")
