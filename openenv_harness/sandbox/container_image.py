"""The default image of the container sandbox, built on this machine from Debian packages.

Why built here and not pulled: a machine that trains often reaches a Debian mirror but no image
registry, and an image made from the distribution's own packages by ``debootstrap`` needs nothing
else. Why this content: the in-container relay is a standard-library Python program (``python3``);
agents run shell tools (bash, coreutils, grep, sed, find, diff, patch, git); the host's ``node`` is
bind-mounted read-only into each container, so the image carries the C and C++ runtime it links
against (glibc comes with the base system, ``libstdc++6`` is added). The agent runs as ``agent``
(uid/gid 1000) with a passwd entry and a home: Node's ``os.userInfo()`` throws for a uid that has none.

``python -m openenv_harness.sandbox.container_image`` builds the image when it is absent.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from openenv_harness.sandbox.base import SandboxError
from openenv_harness.sandbox.container_engine import ContainerEngine, require_container_engine

#: The tag the container sandbox runs unless given ``--image``. The suffix counts changes to the
#: content below: a change bumps it, so a machine with the old image builds the new one.
DEFAULT_IMAGE = "openenv-harness/sandbox:bookworm-1"
DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: Set on every image built here, so that a person (or a clean-up) can list them.
IMAGE_LABEL = "openenv-harness.image=1"
#: Installed on top of debootstrap's ``minbase`` variant (essential packages and apt).
PACKAGES: tuple[str, ...] = (
    "python3", "bash", "coreutils", "procps", "git", "ca-certificates", "findutils", "sed", "grep",
    "diffutils", "patch", "libstdc++6",
)
AGENT_USER = "agent"
AGENT_UID = 1000
AGENT_HOME = "/home/agent"

DEBOOTSTRAP_REMEDY = "install it as root: `apt-get install debootstrap`"
#: debootstrap takes under a minute on a near mirror; this bounds a stalled download.
_DEBOOTSTRAP_TIMEOUT_S = 1800.0
_IMPORT_TIMEOUT_S = 900.0
_LOG_TAIL_CHARS = 3000

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def image_present(engine: ContainerEngine, tag: str = DEFAULT_IMAGE) -> bool:
    """Whether ``tag`` names an image the engine has (False too when the engine does not answer)."""
    return engine.run_cli(["image", "inspect", "--format", "{{.Id}}", tag], check=False).returncode == 0


def _deb822_mirror(text: str, suite: str) -> str | None:
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" in fields.get("types", "").split() and suite in fields.get("suites", "").split():
            uris = fields.get("uris", "").split()
            if uris:
                return uris[0]
    return None


def _one_line_mirror(text: str, suite: str) -> str | None:
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        words = words[1:]
        if words and words[0].startswith("["):  # options: [arch=amd64 signed-by=...]
            while words and not words[0].endswith("]"):
                words = words[1:]
            words = words[1:]
        if len(words) >= 2 and words[1] == suite:
            return words[0]
    return None


def default_mirror(suite: str = DEFAULT_SUITE, etc: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this machine's apt already uses for ``suite``, else deb.debian.org.

    Why the machine's own: where apt works, that mirror is reachable (a proxy, a local mirror);
    matching the suite keeps an Ubuntu host's mirror, which has no ``bookworm``, out.
    """
    for path, parse in ((etc / "sources.list.d" / "debian.sources", _deb822_mirror),
                        (etc / "sources.list", _one_line_mirror)):
        try:
            text = path.read_text()
        except OSError:
            continue
        mirror = parse(text, suite)
        if mirror:
            return mirror
    return DEFAULT_MIRROR


def _debootstrap() -> str:
    # /usr/sbin is often off a non-root user's PATH
    found = shutil.which("debootstrap") or next(
        (p for p in ("/usr/sbin/debootstrap", "/sbin/debootstrap") if os.access(p, os.X_OK)), None)
    if not found:
        raise SandboxError(f"building the container image: debootstrap is not installed; {DEBOOTSTRAP_REMEDY}")
    return found


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-_LOG_TAIL_CHARS:].strip()
    except OSError:
        return "(no log)"


def _run_logged(argv: list[str], log: Path, timeout_s: float) -> int | None:
    """Run ``argv`` with its output in ``log``; the exit code, or None when it ran past ``timeout_s``
    (then it and everything it started are killed: debootstrap runs wget and dpkg under it)."""
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None


def _mounts_under(root: Path) -> list[str]:
    """Mount points at or below ``root``, deepest first (from /proc/self/mountinfo)."""
    prefix = str(root.resolve())
    found: list[str] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # \040: a space
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(found, key=len, reverse=True)


def _remove_tree(path: Path) -> None:
    """Delete a build directory, after unmounting what a killed debootstrap left mounted in it
    (its /proc, /sys and bind-mounted /dev nodes): deleting through such a mount reaches the host's.
    When a mount stays, the directory stays too (and is named)."""
    for point in _mounts_under(path):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    left = _mounts_under(path)
    if left:
        print(f"warning: {path} left in place: still mounted there: {', '.join(left)}", file=sys.stderr)
        return
    shutil.rmtree(path, ignore_errors=True)


def _add_agent_user(rootfs: Path) -> None:
    """``agent`` (uid/gid 1000, home /home/agent, bash), appended to the image's account files."""
    etc = rootfs / "etc"
    passwd = etc / "passwd"
    taken = {line.split(":")[2] for line in passwd.read_text().splitlines() if line.count(":") >= 3}
    if str(AGENT_UID) in taken:
        raise SandboxError(f"building the container image: uid {AGENT_UID} is already taken in {passwd}")
    days = int(time.time() // 86400)
    entries = {
        "passwd": f"{AGENT_USER}:x:{AGENT_UID}:{AGENT_UID}:{AGENT_USER}:{AGENT_HOME}:/bin/bash",
        "group": f"{AGENT_USER}:x:{AGENT_UID}:",
        "shadow": f"{AGENT_USER}:!:{days}:0:99999:7:::",  # locked: no password logs in
        "gshadow": f"{AGENT_USER}:!::",
    }
    for name, entry in entries.items():
        path = etc / name
        if name in ("shadow", "gshadow") and not path.exists():
            continue
        text = path.read_text()
        path.write_text(text + ("" if not text or text.endswith("\n") else "\n") + entry + "\n")
    home = rootfs / AGENT_HOME.lstrip("/")
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o755)
    os.chown(home, AGENT_UID, AGENT_UID)


def _slim(rootfs: Path) -> None:
    """Drop what only the build needed: downloaded packages, apt's lists and caches, the build host's name."""
    for pattern in ("var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*"):
        for path in rootfs.glob(pattern):
            if path.is_file() or path.is_symlink():
                path.unlink()
            elif path.is_dir():
                shutil.rmtree(path)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/hostname").write_text("localhost\n")  # the engine sets each container's own


def _import(engine: ContainerEngine, rootfs: Path, tag: str, logs: Path) -> str:
    """``tar -C rootfs -c . | <engine> import --change ... - tag``, streamed (the tree is ~300 MB)."""
    # /dev, /proc and /sys are the engine's to provide; numeric owners, as the image's passwd has them
    tar_argv = ["tar", "-C", str(rootfs), "--numeric-owner", "--exclude=./dev/*", "--exclude=./proc/*",
                "--exclude=./sys/*", "-c", "."]
    import_argv = [engine.binary, "import", "--change", 'CMD ["sleep","infinity"]', "--change",
                   f"LABEL {IMAGE_LABEL}", "-", tag]
    tar_err, imp_err = logs / "tar.stderr", logs / "import.stderr"
    with tar_err.open("wb") as te, imp_err.open("wb") as ie:
        tar = subprocess.Popen(tar_argv, stdout=subprocess.PIPE, stderr=te, stdin=subprocess.DEVNULL)
        assert tar.stdout is not None
        try:
            imp = subprocess.Popen(import_argv, stdin=tar.stdout, stdout=subprocess.PIPE, stderr=ie)
        except OSError as exc:
            tar.kill()
            tar.wait()
            raise SandboxError(f"building the container image: `{engine.binary} import` could not be run: {exc}") \
                from exc
        tar.stdout.close()  # the importer holds the pipe now; tar sees it close if the importer dies
        try:
            out, _ = imp.communicate(timeout=_IMPORT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            imp.kill()
            tar.kill()
            imp.wait()
            tar.wait()
            raise SandboxError(f"building the container image: `{engine.binary} import` did not finish in "
                               f"{_IMPORT_TIMEOUT_S:.0f} s") from None
        tar_code = tar.wait()
    if imp.returncode != 0:
        raise SandboxError(f"building the container image: `{engine.binary} import` failed with exit code "
                           f"{imp.returncode}: {_tail(imp_err)}")
    if tar_code != 0:
        raise SandboxError(f"building the container image: tar of the root file system failed with exit code "
                           f"{tar_code}: {_tail(tar_err)}")
    return out.decode(errors="replace").strip().splitlines()[-1] if out.strip() else tag


def build_image(engine: ContainerEngine, tag: str = DEFAULT_IMAGE, *, mirror: str | None = None,
                suite: str = DEFAULT_SUITE, workdir: str | Path | None = None,
                progress: Progress = _quiet) -> str:
    """Build ``tag`` from ``suite``'s packages and return the image id the engine gives it.

    Steps: debootstrap (``minbase`` plus ``PACKAGES``) into a fresh directory under ``workdir`` (the
    system's temporary directory by default; ~400 MB), add the ``agent`` user, drop apt's caches,
    import the tree as one layer. Needs root (debootstrap creates device nodes and chroots). Each
    failure raises ``SandboxError`` naming the step, with debootstrap's log tail where it failed.
    """
    debootstrap = _debootstrap()
    if os.geteuid() != 0:
        raise SandboxError("building the container image: debootstrap needs root (it chroots and sets file "
                           "owners); run `python -m openenv_harness.sandbox.container_image` as root, once")
    mirror = mirror or default_mirror(suite)
    build = Path(tempfile.mkdtemp(prefix="oeh-image-", dir=workdir))
    try:
        rootfs, log = build / "rootfs", build / "debootstrap.log"
        argv = [debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}", suite, str(rootfs), mirror]
        progress(f"debootstrap {suite} from {mirror} into {rootfs}")
        started = time.monotonic()
        code = _run_logged(argv, log, _DEBOOTSTRAP_TIMEOUT_S)
        if code != 0:
            why = (f"did not finish in {_DEBOOTSTRAP_TIMEOUT_S:.0f} s" if code is None
                   else f"failed with exit code {code}")
            hint = ""
            if not Path("/usr/share/keyrings/debian-archive-keyring.gpg").exists():
                hint = " (this machine has no Debian archive keyring: `apt-get install debian-archive-keyring`)"
            raise SandboxError(f"building the container image: debootstrap of {suite} from {mirror} {why}{hint}; "
                               f"its log ends:\n{_tail(log)}")
        progress(f"debootstrap done in {time.monotonic() - started:.0f} s; adding user {AGENT_USER} "
                 f"(uid {AGENT_UID})")
        _add_agent_user(rootfs)
        _slim(rootfs)
        progress(f"importing into {engine.kind} as {tag}")
        return _import(engine, rootfs, tag, build)
    finally:
        _remove_tree(build)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openenv_harness.sandbox.container_image",
                                     description="Build the container sandbox's default image when it is absent.")
    parser.add_argument("--tag", default=DEFAULT_IMAGE, help=f"image tag (default {DEFAULT_IMAGE})")
    parser.add_argument("--force", action="store_true", help="build even when the tag is present")
    parser.add_argument("--engine", choices=["docker", "podman"], default=None,
                        help="container engine (default: docker, else podman)")
    parser.add_argument("--mirror", default=None, help="Debian mirror (default: the one apt uses here)")
    parser.add_argument("--suite", default=DEFAULT_SUITE, help=f"Debian suite (default {DEFAULT_SUITE})")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each step on stderr")
    args = parser.parse_args(argv)
    started = time.monotonic()

    def say(line: str) -> None:
        print(f"[{time.monotonic() - started:5.0f} s] {line}", file=sys.stderr, flush=True)

    try:
        engine = require_container_engine(args.engine)
        if not args.force and image_present(engine, args.tag):
            print(f"{args.tag}: present in {engine.kind} (checked in {time.monotonic() - started:.1f} s)")
            return 0
        old = engine.run_cli(["image", "inspect", "--format", "{{.Id}}", args.tag], check=False)
        image_id = build_image(engine, args.tag, mirror=args.mirror, suite=args.suite,
                               progress=say if args.verbose else _quiet)
    except SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    previous = old.stdout.decode().strip()
    if old.returncode == 0 and previous and previous != image_id:
        # the rebuilt tag moved: the old image is unreferenced now (kept if a container still uses it)
        engine.run_cli(["image", "rm", previous], check=False)
    print(f"{args.tag}: built with {engine.kind} in {time.monotonic() - started:.0f} s ({image_id})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
