"""The environment's Dockerfile: read statically, and its entry command run as the image would run it.

No Docker engine runs here, so the image is checked in two halves. Statically: Python 3.11, Node 20,
ripgrep, the pinned CLIs installed at build time into the prefix the server reads, a non-root uid
1000 user, port 8000, a health check. Dynamically: the image's own ``CMD`` (parsed from the file)
is started in a subprocess with the ``ENV`` the file sets -- only the values that name this
machine's places (port, home, data dir) replaced -- and must answer ``/health``; the ``HEALTHCHECK``
command itself must pass against it.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from harness_env import HarnessEnv

from openenv_harness.recorder import free_port
from openenv_harness.space.dockerfile import Instruction, final_stage, image_env, parse_dockerfile

from env_support import ADMIN, ENVS, REPO

DOCKERFILE = ENVS / "harness_env" / "server" / "Dockerfile"
DOCKERIGNORE = DOCKERFILE.with_name("Dockerfile.dockerignore")
#: ENV values that name places on the machine the image runs on; everything else is used verbatim.
MACHINE_SPECIFIC = {"PORT", "HOME", "OEH_DATA_DIR"}


def exec_form(args: str) -> list[str]:
    argv = json.loads(args)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), args
    return argv


def only(stage: list[Instruction], keyword: str) -> Instruction:
    found = [ins for ins in stage if ins.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {len(found)}"
    return found[0]


STAGE = final_stage(parse_dockerfile(DOCKERFILE))


def test_base_images_python_311_and_node_20() -> None:
    froms = [ins.args for ins in parse_dockerfile(DOCKERFILE) if ins.keyword == "FROM"]
    assert froms[-1].startswith("python:3.11")
    assert any(f.startswith("node:20") for f in froms[:-1])
    copies = [ins.args for ins in STAGE if ins.keyword == "COPY" and ins.args.startswith("--from=node")]
    assert any("/usr/local/bin/node" in c for c in copies)


def test_ripgrep_node_tools_and_the_pinned_cli_install_step() -> None:
    runs = [ins.args for ins in STAGE if ins.keyword == "RUN"]
    assert any("apt-get install" in r and "ripgrep" in r for r in runs)
    prefix = image_env(STAGE)["OPENENV_HARNESS_NODE_PREFIX"]
    assert prefix.startswith("/")
    install = [i for i, ins in enumerate(STAGE) if ins.keyword == "RUN"
               and "python -m openenv_harness.harnesses.install" in ins.args]
    assert len(install) == 1
    install_args = STAGE[install[0]].args
    assert "pi" in install_args.split() and "opencode" in install_args.split()
    assert '--prefix "$OPENENV_HARNESS_NODE_PREFIX"' in install_args
    users_before = [ins.args for ins in STAGE[: install[0]] if ins.keyword == "USER"]
    assert users_before and users_before[-1] not in ("root", "0")  # installed as (and owned by) the runtime user


def test_runs_as_non_root_uid_1000_exposes_8000_and_checks_health() -> None:
    users = [ins.args for ins in STAGE if ins.keyword == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert any("useradd" in ins.args and "--uid 1000" in ins.args and users[-1] in ins.args.split()
               for ins in STAGE if ins.keyword == "RUN")
    assert only(STAGE, "EXPOSE").args == "8000"
    assert image_env(STAGE)["PORT"] == "8000"
    health = only(STAGE, "HEALTHCHECK").args
    assert "/health" in health and " CMD " in f" {health} "


def test_copied_sources_exist_and_are_not_ignored() -> None:
    ignored = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    sources = []
    for ins in STAGE:
        if ins.keyword == "COPY" and not ins.args.startswith("--from"):
            sources += shlex.split(ins.args)[:-1]
    assert {"pyproject.toml", "openenv_harness", "envs/harness_env"} <= set(sources)
    for source in sources:
        assert (REPO / source).exists(), source
        assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), source


@pytest.fixture
def image_entry(tmp_path: Path) -> Iterator[tuple[str, dict[str, str], subprocess.Popen[bytes], Path]]:
    """The image's CMD started here, with the image's ENV; yields (url, env, process, log path)."""
    argv = exec_form(only(STAGE, "CMD").args)
    assert argv[0] == "python"  # the image's python, which has the package installed
    env_in_image = image_env(STAGE)
    assert MACHINE_SPECIFIC <= set(env_in_image)
    port = free_port()
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "LANG": "C.UTF-8",
        **env_in_image,
        "PORT": str(port),
        "HOME": str(home),
        "OEH_DATA_DIR": str(tmp_path / "data"),
        "OEH_ADMIN_TOKEN": ADMIN,  # a Space secret at run time
        "PYTHONPATH": str(ENVS),  # what `pip install ./envs/harness_env` does in the image
    }
    log = open(tmp_path / "server.log", "wb")
    process = subprocess.Popen([sys.executable, *argv[1:]], env=env, cwd=home, stdout=log,
                               stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                pytest.fail(f"entry command exited {process.returncode}:\n{(tmp_path / 'server.log').read_text()}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("entry command did not answer /health within 120 s:\n"
                            + (tmp_path / "server.log").read_text())
            time.sleep(0.3)
        yield url, env, process, tmp_path / "server.log"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()


@pytest.mark.slow
def test_the_images_entry_command_serves_the_environment(image_entry) -> None:
    url, env, process, log = image_entry
    assert httpx.get(f"{url}/health", timeout=10).json()["status"] == "healthy"
    assert httpx.get(f"{url}/metadata", timeout=10).json()["name"] == "harness_env"
    # the embedded recorder started with the app and answers through the server's own port
    health = httpx.get(f"{url}/recorder/admin/health", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    # the server looks for the agent CLIs exactly where the image's install step puts them
    with HarnessEnv(base_url=url).sync() as client:
        with pytest.raises(RuntimeError, match=rf"not installed at {env['OPENENV_HARNESS_NODE_PREFIX']}/"):
            client.reset(task_id="fix-add", harness="pi")
    # the image's HEALTHCHECK command passes against it
    check = exec_form(only(STAGE, "HEALTHCHECK").args.split(" CMD ", 1)[1])
    assert check[0] == "python"
    done = subprocess.run([sys.executable, *check[1:]], env=env, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    # and it shuts down cleanly on SIGTERM, as `docker stop` sends (uvicorn re-raises the signal
    # once its shutdown is complete, so the status is "killed by SIGTERM")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) in (0, -signal.SIGTERM)
    text = log.read_text()
    assert "harness_env: embedded mode, recorder at http://127.0.0.1:" in text
    assert "harness_env: recorder stopped" in text  # the app's shutdown ran and stopped the recorder
