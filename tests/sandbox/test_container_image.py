"""The container engine probe and the container sandbox's default image, against the real engine.

The tests marked ``slow`` run containers: they need docker (``./dev setup`` installs it, starts its
daemon and builds the image) and fail, not skip, where it is missing -- CI has it. The others run
anywhere: no engine, or an engine that does not answer, must be named with the way to fix it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from openenv_harness.sandbox import SandboxError
from openenv_harness.sandbox.container_engine import (
    REMEDY,
    ContainerEngine,
    find_container_engine,
    require_container_engine,
)
from openenv_harness.sandbox.container_image import (
    DEFAULT_IMAGE,
    IMAGE_LABEL,
    build_image,
    default_mirror,
    image_present,
)


@pytest.fixture(scope="session")
def engine() -> ContainerEngine:
    return require_container_engine("docker")


@pytest.fixture(scope="session")
def image(engine: ContainerEngine) -> str:
    """The default image; ``./dev setup`` builds it, this builds it where it did not run (~1 min, as root)."""
    if not image_present(engine, DEFAULT_IMAGE):
        build_image(engine, DEFAULT_IMAGE)
    return DEFAULT_IMAGE


def _in_container(engine: ContainerEngine, image: str, script: str, *extra: str) -> str:
    done = engine.run_cli(["run", "--rm", "--network", "none", *extra, image, "bash", "-c", script], timeout_s=120)
    return done.stdout.decode()


# -- anywhere --------------------------------------------------------------------------------------


def test_an_engine_that_is_not_installed_is_named_with_the_remedy() -> None:
    assert find_container_engine("oeh-no-such-engine") is None
    with pytest.raises(SandboxError) as caught:
        require_container_engine("oeh-no-such-engine")
    assert "no container engine `oeh-no-such-engine` is installed" in str(caught.value)
    assert REMEDY in str(caught.value) and "apt-get install docker.io" in REMEDY and "podman" in REMEDY


def test_an_engine_whose_daemon_does_not_answer_says_why(tmp_path: Path) -> None:
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///x.sock.' >&2\n"
                    "echo 'second line' >&2\nexit 1\n")
    fake.chmod(0o755)
    engine = find_container_engine(str(fake))
    assert engine == ContainerEngine(str(fake), "docker")
    ok, why = engine.available()
    assert not ok
    assert why == "docker is installed but its daemon does not answer: Cannot connect to the Docker daemon at unix:///x.sock."
    with pytest.raises(SandboxError, match="daemon does not answer: Cannot connect.*apt-get install docker.io"):
        require_container_engine(str(fake))


def test_run_cli_raises_with_the_commands_stderr() -> None:
    sh = ContainerEngine("/bin/sh", "docker")  # any program: run_cli only runs its binary with the arguments
    with pytest.raises(SandboxError, match=r"exit code 3: boom"):
        sh.run_cli(["-c", "echo boom >&2; exit 3"])
    assert sh.run_cli(["-c", "exit 3"], check=False).returncode == 3
    assert sh.run_cli(["-c", "cat"], input=b"in").stdout == b"in"
    started = time.monotonic()
    with pytest.raises(SandboxError, match="did not finish in 0.5 s"):
        sh.run_cli(["-c", "sleep 30"], timeout_s=0.5)
    assert time.monotonic() - started < 10


def test_the_mirror_is_the_one_apt_uses_for_the_suite(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    assert default_mirror("bookworm", tmp_path) == "http://deb.debian.org/debian"  # nothing configured
    (tmp_path / "sources.list").write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb http://archive.ubuntu.com/ubuntu jammy main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://old.example/debian bookworm main\n")
    assert default_mirror("bookworm", tmp_path) == "http://old.example/debian"
    assert default_mirror("trixie", tmp_path) == "http://deb.debian.org/debian"  # no mirror of that suite here
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://security.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb\n# a snapshot\nURIs: http://near.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n")
    assert default_mirror("bookworm", tmp_path) == "http://near.example/debian"  # deb822 first, its suite's stanza


def test_a_build_that_cannot_debootstrap_names_debootstrap_and_leaves_nothing(tmp_path: Path) -> None:
    """A mirror nothing listens on: the error names the step and the mirror, fast, and the build
    directory is gone. (Without root or without debootstrap the error names debootstrap too.)"""
    work = tmp_path / "work"
    work.mkdir()
    started = time.monotonic()
    with pytest.raises(SandboxError) as caught:
        build_image(ContainerEngine("docker", "docker"), "oeh-test/never:built", mirror="http://127.0.0.1:9/debian",
                    workdir=work)
    message = str(caught.value)
    assert "building the container image: debootstrap" in message, message
    if os.geteuid() == 0 and (shutil.which("debootstrap") or os.path.exists("/usr/sbin/debootstrap")):
        assert "debootstrap of bookworm from http://127.0.0.1:9/debian failed with exit code" in message, message
        assert "its log ends:" in message and "127.0.0.1" in message.split("its log ends:")[1], message
    assert time.monotonic() - started < 60
    assert list(work.iterdir()) == []


# -- against docker --------------------------------------------------------------------------------


@pytest.mark.slow
def test_docker_is_found_and_answers(engine: ContainerEngine) -> None:
    found = find_container_engine()
    assert found is not None and found.kind == "docker", found
    ok, version = found.available()
    assert ok and version[0].isdigit(), version
    assert engine.kind == "docker"


@pytest.mark.slow
def test_the_default_image_is_present_labelled_and_idles(engine: ContainerEngine, image: str) -> None:
    assert image_present(engine, image)
    assert not image_present(engine, "oeh-test/no-such-image:0")
    config = engine.run_cli(["image", "inspect", "--format", "{{json .Config.Cmd}} {{json .Config.Labels}}", image])
    key, value = IMAGE_LABEL.split("=")
    assert config.stdout.decode().split() == ['["sleep","infinity"]', f'{{"{key}":"{value}"}}']


@pytest.mark.slow
def test_the_image_runs_python_offline_with_its_tools(engine: ContainerEngine, image: str) -> None:
    out = _in_container(engine, image, "python3 -c 'import json, ssl, sys; print(json.dumps(sys.version_info[:2]))'; "
                        "for t in bash git patch diff ps find sed grep; do command -v $t >/dev/null || echo missing $t; "
                        "done; ls /usr/lib/*/libstdc++.so.6; ls /var/lib/apt/lists /var/cache/apt/archives | grep deb$ || true")
    lines = out.splitlines()
    assert lines[0] == "[3, 11]", out  # bookworm's python3
    assert not any(ln.startswith("missing") for ln in lines), out
    assert any(ln.endswith("libstdc++.so.6") for ln in lines), out
    assert not any(ln.endswith(".deb") for ln in lines), "apt's downloads are not kept in the image"


@pytest.mark.slow
def test_the_agent_user_has_uid_1000_a_passwd_entry_and_a_home(engine: ContainerEngine, image: str) -> None:
    out = _in_container(engine, image, "id agent; getent passwd 1000; stat -c '%u:%g %a' /home/agent")
    assert out.splitlines() == ["uid=1000(agent) gid=1000(agent) groups=1000(agent)",
                                "agent:x:1000:1000:agent:/home/agent:/bin/bash", "1000:1000 755"], out
    out = _in_container(engine, image, 'echo "$(id -un) $HOME"; touch "$HOME/x" && echo writable', "--user", "1000:1000")
    assert out.splitlines() == ["agent /home/agent", "writable"], out


@pytest.mark.slow
def test_the_hosts_node_runs_in_the_image_as_the_agent(engine: ContainerEngine, image: str) -> None:
    """The sandbox bind-mounts this machine's ``node`` read-only: the image has the libraries it links
    against, and ``os.userInfo()`` (which throws for a uid without a passwd entry) answers."""
    node = shutil.which("node")
    assert node, "node is installed by ./dev setup"
    node = os.path.realpath(node)
    out = _in_container(engine, image, "node -e 'console.log(require(\"os\").userInfo().username)'",
                        "--user", "1000:1000", "-v", f"{node}:/usr/local/bin/node:ro")
    assert out.strip() == "agent", out


@pytest.mark.slow
def test_the_image_module_reports_a_present_image_in_one_line(image: str) -> None:
    import sys

    done = subprocess.run([sys.executable, "-m", "openenv_harness.sandbox.container_image", "--tag", image],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{image}: present in docker (checked in "), done.stdout
    assert len(done.stdout.splitlines()) == 1
