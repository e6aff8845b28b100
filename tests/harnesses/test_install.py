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
    monkeypatch.setattr(install, "_pip_install", _forbid("pip install"))
    monkeypatch.setattr(install, "probe_version", _forbid("a --version probe"))
    started = time.monotonic()
    paths = ensure_installed(None, prefix=node_prefix)
    assert time.monotonic() - started < 1.0
    assert set(paths) == set(preset_names())
    assert {"pi", "opencode", "codex", "claude-code", "gemini-cli", "mini-swe-agent"} <= set(paths)
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


# -- Python agents: a venv of their own ---------------------------------------------------------------


def _wheel(directory: Path, name: str, version: str) -> Path:
    """A tiny wheel with one console script, ``<name>`` (prints the version), built by hand."""
    import base64
    import hashlib
    import zipfile

    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"def main():\n    print('{name} {version}')\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": f"[console_scripts]\n{name} = {module}:main\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    wheel = directory / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def _python_preset(version: str):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    return replace(get_preset("pi"), name="demo-agent", npm_package="", pip_package="demo-agent", version=version,
                   bin_name="demo-agent", binary="venvs/demo-agent/bin/demo-agent", requires=(),
                   version_probe="interpreter", version_argv=("-c", "import demo_agent; demo_agent.main()"))


def test_pip_spec_and_npm_spec() -> None:
    from dataclasses import replace

    mini = get_preset("mini-swe-agent")
    assert (mini.pip_package, mini.npm_package, mini.install_spec) == ("mini-swe-agent", "", "mini-swe-agent==2.4.6")
    assert mini.binary == "venvs/mini-swe-agent/bin/mini"
    assert get_preset("pi").install_spec == get_preset("pi").npm_spec, "npm presets install as before"
    with pytest.raises(ValueError, match="exactly one of npm_package and pip_package"):
        replace(mini, npm_package="mini-swe-agent")


@pytest.mark.slow  # creates a venv (ensurepip)
def test_a_python_agent_gets_a_venv_of_its_own_and_a_link_on_path(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "demo-agent", "1.0.0")
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # offline: only the wheel built here
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    prefix = tmp_path / "prefix"
    monkeypatch.setattr(install, "get_preset", lambda name: {"demo-agent": _python_preset("1.0.0"),
                                                              "missing": _python_preset("2.0.0")}[name])
    monkeypatch.setattr(install, "_npm_install", _forbid("npm install"))
    with pytest.raises(InstallError, match="pip install .*demo-agent==2.0.0 failed"):
        ensure_installed(["missing"], prefix=prefix)

    paths = ensure_installed(["demo-agent"], prefix=prefix)
    binary = prefix / "venvs" / "demo-agent" / "bin" / "demo-agent"
    assert paths == {"demo-agent": binary} and os.access(binary, os.X_OK)
    assert install.installed_version(_python_preset("1.0.0"), prefix) == "1.0.0"
    link = prefix / "venvs" / ".bin" / "demo-agent"
    assert link.is_symlink() and link.resolve() == binary.resolve()
    assert sorted(p.name for p in link.parent.iterdir()) == ["demo-agent"], "no venv python on the agents' PATH"
    stamp = (prefix / ".openenv-harness" / "demo-agent.json").read_text()
    assert '"spec": "demo-agent==1.0.0"' in stamp

    # done: no pip, no probe; a lost link is put back by a probe, never by pip
    monkeypatch.setattr(install, "_pip_install", _forbid("pip install"))
    probes: list[Path] = []
    real_probe = install.probe_version
    monkeypatch.setattr(install, "probe_version", lambda preset, path: probes.append(path) or real_probe(preset, path))
    assert ensure_installed(["demo-agent"], prefix=prefix) == paths and probes == []
    link.unlink()
    assert ensure_installed(["demo-agent"], prefix=prefix) == paths and probes == [binary]
    assert link.resolve() == binary.resolve()

    from openenv_harness.sandbox import LocalSandbox

    with LocalSandbox(node_prefix=prefix, parent_dir=tmp_path) as box:  # reachable by name, its python is not
        found = box.run(["sh", "-c", "command -v demo-agent; demo-agent; command -v python3 || true"], timeout_s=60)
    lines = found.stdout.splitlines()
    assert lines[:2] == [str(link), "demo-agent 1.0.0"] and not any(str(prefix) in line for line in lines[2:])


@pytest.mark.cli
def test_mini_swe_agent_is_verified_by_its_venvs_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    preset = get_preset("mini-swe-agent")
    paths = ensure_installed(["mini-swe-agent"])  # only this agent: the shared prefix may lack the others
    probe = install.probe_version(preset, paths["mini-swe-agent"])
    assert probe.runs and probe.output == "2.4.6", probe.message
    assert paths["mini-swe-agent"] == default_node_prefix() / "venvs" / "mini-swe-agent" / "bin" / "mini"
    assert install.installed_version(preset) == "2.4.6"
    monkeypatch.setattr(install, "_pip_install", _forbid("pip install"))
    monkeypatch.setattr(install, "probe_version", _forbid("a --version probe"))
    assert ensure_installed(["mini-swe-agent"]) == paths
