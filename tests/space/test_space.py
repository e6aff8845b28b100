"""The environment as a Space folder: built from exactly what its Dockerfile copies, accepted by
OpenEnv's validator, and run by it -- runtime checks executed -- through the local-process provider."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from openenv.validation import run_validation
from openenv.validation.types import Level, Verdict

from openenv_harness.space import build_space, space_sources
from openenv_harness.space.build import DOCKERFILE, RUNTIME_PLAN, SpaceBuildError, source_root
from openenv_harness.space.dockerfile import copied_sources, ignore_patterns, ignored, parse_dockerfile
from openenv_harness.space.validation import LocalProcessProvider

REPO = Path(__file__).resolve().parents[2]
EXTRAS = {"Dockerfile", "openenv.yaml", "README.md", "validation/runtime.json"}


@pytest.fixture(scope="module")
def space(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    out = tmp_path_factory.mktemp("space") / "harness-env"
    return out, build_space(out)


def test_dockerignore_patterns_match_from_the_root_or_at_any_depth() -> None:
    patterns = ["tests", "**/__pycache__", "*.egg-info", ".venv*"]
    assert ignored("tests/x.py", patterns) and ignored("openenv_harness/a/__pycache__/m.pyc", patterns)
    assert ignored("openenv_harness.egg-info/PKG-INFO", patterns) and ignored(".venv-verifiers/bin/python", patterns)
    assert not ignored("openenv_harness/testing/engine/server.py", patterns)  # "tests" is a root folder only
    assert not ignored("openenv_harness/recorder/call/pipeline.py", patterns)


def test_the_folder_holds_what_the_dockerfile_copies_and_nothing_else(space: tuple[Path, list[str]]) -> None:
    out, files = space
    dockerfile = REPO / DOCKERFILE
    patterns = ignore_patterns(dockerfile.with_name("Dockerfile.dockerignore"))
    expected: set[str] = set()
    for source in copied_sources(parse_dockerfile(dockerfile)):
        path = REPO / source
        for file in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]:
            rel = file.relative_to(REPO).as_posix()
            if not ignored(rel, patterns):
                expected.add(rel)
    assert {"pyproject.toml", "openenv_harness/recorder/call/pipeline.py", "envs/harness_env/server/app.py"} <= expected
    assert set(files) == expected | EXTRAS
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert on_disk == set(files)
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in files)
    assert (out / "Dockerfile").read_text() == dockerfile.read_text()  # the same image, its context now the folder
    assert space_sources(source_root()) == sorted(expected)


def test_the_manifest_declares_the_runtime_binding_and_the_card_is_the_spaces(space: tuple[Path, list[str]]) -> None:
    out, _ = space
    manifest = yaml.safe_load((out / "openenv.yaml").read_text())
    assert manifest["validation"]["execution"] == {"kind": "openenv_ws", "probe_path": "validation/runtime.json",
                                                   "dockerfile": "Dockerfile", "context": "."}
    original = yaml.safe_load((REPO / "envs/harness_env/openenv.yaml").read_text())
    assert {k: v for k, v in manifest.items() if k != "validation"} == {
        k: v for k, v in original.items() if k != "validation"}
    assert json.loads((out / "validation/runtime.json").read_text()) == RUNTIME_PLAN
    card = yaml.safe_load((out / "README.md").read_text().split("---\n")[1])
    assert card["sdk"] == "docker" and card["app_port"] == 8000
    assert run_validation(out, max_level=Level.STATIC, skip_build=True).verdict is Verdict.PASS


def test_an_occupied_destination_is_refused(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(SpaceBuildError, match="not an empty folder"):
        build_space(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


@pytest.mark.cli
@pytest.mark.slow
def test_openenvs_runtime_checks_run_an_episode_on_the_folder(space: tuple[Path, list[str]], tmp_path: Path) -> None:
    """OpenEnv's own graders: the image's command starts from the folder's sources alone and one Pi episode
    runs over OpenEnv's WebSocket protocol (reset, RunAgent, state); what a process cannot enforce is skipped,
    named."""
    out, _ = space
    report = run_validation(out, max_level=Level.RUNTIME, provider=LocalProcessProvider(tmp_path / "provider"))
    status = {r.check_id: r.status.value for r in report.results}
    assert {k: status[k] for k in ("runtime.startup", "runtime.observation_schema", "runtime.reward_well_formed",
                                   "runtime.state_contract")} == dict.fromkeys(
        ("runtime.startup", "runtime.observation_schema", "runtime.reward_well_formed", "runtime.state_contract"),
        "pass"), report.results
    assert status["runtime.network_policy"] == "skip"
    assert report.verdict in (Verdict.PASS, Verdict.WARN)
    startup = next(r for r in report.results if r.check_id == "runtime.startup")
    assert startup.measured["provider"] == "local-process"


def test_a_folder_missing_a_copied_source_fails_startup_with_the_reason(space: tuple[Path, list[str]],
                                                                        tmp_path: Path) -> None:
    out, _ = space
    broken = tmp_path / "broken"
    subprocess.run(["cp", "-r", str(out), str(broken)], check=True)
    subprocess.run(["rm", "-r", str(broken / "envs")], check=True)
    report = run_validation(broken, max_level=Level.RUNTIME, provider=LocalProcessProvider(tmp_path / "provider"))
    startup = next(r for r in report.results if r.check_id == "runtime.startup")
    assert startup.status.value in ("fail", "error") and report.verdict is Verdict.FAIL
    assert any("envs/harness_env" in line for line in startup.evidence), startup.evidence


@pytest.mark.cli
@pytest.mark.slow
def test_the_cli_builds_and_validates(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    built = subprocess.run([sys.executable, "-m", "openenv_harness.cli", "space", "build", str(tmp_path / "s")],
                           capture_output=True, text=True, timeout=120, env=env)
    assert built.returncode == 0 and "wrote" in built.stdout, built.stderr
    again = subprocess.run([sys.executable, "-m", "openenv_harness.cli", "space", "build", str(tmp_path / "s")],
                           capture_output=True, text=True, timeout=120, env=env)
    assert again.returncode == 2 and "not an empty folder" in again.stderr
    done = subprocess.run([sys.executable, "-m", "openenv_harness.cli", "space", "validate", str(tmp_path / "s"),
                           "--json", str(tmp_path / "report.json")], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "PASS  runtime.reward_well_formed" in done.stdout and "runtime check(s) executed" in done.stdout
    assert json.loads((tmp_path / "report.json").read_text())["verdict"] in ("pass", "warn")
