"""The environment follows OpenEnv's package layout, and OpenEnv's own validators accept it."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest
import yaml
from openenv.cli._validation import validate_running_environment
from openenv.validation import run_validation
from openenv.validation.types import Level, Verdict

from openenv_harness.recorder import ThreadedServer

from env_support import ENVS

ENV_DIR = ENVS / "harness_env"


def test_manifest_and_package_metadata() -> None:
    manifest = yaml.safe_load((ENV_DIR / "openenv.yaml").read_text())
    assert {k: manifest[k] for k in ("spec_version", "name", "type", "runtime", "app", "port")} == {
        "spec_version": 1, "name": "harness_env", "type": "space", "runtime": "fastapi",
        "app": "server.app:app", "port": 8000,
    }
    project = tomllib.loads((ENV_DIR / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["server"] == "harness_env.server.app:main"
    deps = project["project"]["dependencies"]
    assert any(d.startswith("openenv-harness") for d in deps) and "openenv>=0.10" in deps
    package_dirs = project["tool"]["setuptools"]["package-dir"]
    assert (ENV_DIR / package_dirs["harness_env"] / "models.py").is_file()
    assert (ENV_DIR / package_dirs["harness_env.server"] / "app.py").is_file()


def test_readme_has_the_space_frontmatter() -> None:
    text = (ENV_DIR / "README.md").read_text()
    assert text.startswith("---\n")
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["sdk"] == "docker" and front["app_port"] == 8000 and "openenv" in front["tags"]


def test_openenv_static_validation_passes() -> None:
    report = run_validation(ENV_DIR, max_level=Level.STATIC, skip_build=True)
    assert report.verdict is Verdict.PASS, report


def test_openenv_runtime_validation_of_the_running_server(env_server: ThreadedServer) -> None:
    report = validate_running_environment(env_server.url, timeout_s=60)
    assert report["passed"] is True, [c for c in report["criteria"] if not c["passed"]]
    assert report["summary"]["failed_criteria"] == []


@pytest.mark.slow
def test_the_manifest_app_path_imports_from_the_env_directory() -> None:
    """``app: server.app:app`` (what OpenEnv tooling runs from the env directory) resolves too."""
    module, _, attr = yaml.safe_load((ENV_DIR / "openenv.yaml").read_text())["app"].partition(":")
    code = f"import {module} as m; app = m.{attr}; print(type(app).__name__, app.state.harness_backend.config.mode)"
    env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", "HOME": os.environ.get("HOME", "/tmp")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ENV_DIR, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["FastAPI", "embedded"]
