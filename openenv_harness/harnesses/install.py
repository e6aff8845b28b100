"""Install the pinned agent CLIs into the project's own node prefix.

Why a private prefix and exact pins: a trace records which harness version produced it, and that
record is only true if the version cannot drift with whatever ``npm -g`` last installed. So each
preset's ``package@version`` goes into one prefix (``<repo>/.cache/harnesses`` by default, or
``$OPENENV_HARNESS_NODE_PREFIX``) with ``npm install --prefix``; nothing global is touched.

Idempotent and cheap when done: after a verified install a stamp records the binary's size and
mtime; a later call that finds the same stamp does not start a process. A verified install means
the binary answered ``--version`` with the pinned version -- which also catches a package installed
with its install scripts disabled (``--ignore-scripts``, an npm policy that blocks them): OpenCode's
launcher and Claude Code's ``bin/claude.exe`` are then stubs that only say so. Both packages ship
their native binary in a platform package and link it into place from a postinstall script; the
installer runs that script itself (the preset's ``postinstall``) and verifies again.

A Python agent (a preset with ``pip_package``) goes into a venv of its own beside ``node_modules``,
``<prefix>/venvs/<name>``, created with the interpreter that runs the installer and filled with
``pip install package==version``: its dependencies (LiteLLM and the like) never meet another
agent's or the project's. Its executable is linked into ``<prefix>/venvs/.bin``, which a sandbox puts
on PATH after ``node_modules/.bin``: the agent is reachable by name, while the venv's own ``python3``
and ``pip`` stay off the PATH the agents' shell tools see. The same stamp, lock and verification
apply; a CLI without a version flag is verified by its venv's interpreter (``version_probe``).

Run ``python -m openenv_harness.harnesses.install [pi] [opencode] [codex] [claude-code] [--prefix DIR]``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from openenv_harness.harnesses.base import HarnessPreset, home_env
from openenv_harness.harnesses.registry import get_preset, preset_names

PREFIX_ENV = "OPENENV_HARNESS_NODE_PREFIX"
_STATE_DIR = ".openenv-harness"
#: Python agents' venvs, one per preset, beside ``node_modules``.
VENVS_DIR = "venvs"
_NPM_TIMEOUT_S = 1200.0
_PROBE_TIMEOUT_S = 60.0


class InstallError(RuntimeError):
    """A CLI could not be installed or does not run after installing; the message says why."""


def default_node_prefix() -> Path:
    """``$OPENENV_HARNESS_NODE_PREFIX``, else ``<repo>/.cache/harnesses`` in a source checkout,
    else ``~/.cache/openenv-harness/harnesses``."""
    configured = os.environ.get(PREFIX_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file():
        return repo / ".cache" / "harnesses"
    return Path.home() / ".cache" / "openenv-harness" / "harnesses"


def node_bin_dir(prefix: str | os.PathLike[str] | None = None) -> Path:
    """The directory the prefix's executables are linked into (goes on the agent's PATH)."""
    return Path(prefix or default_node_prefix()) / "node_modules" / ".bin"


def venv_bin_dir(prefix: str | os.PathLike[str] | None = None) -> Path:
    """The directory the Python agents' executables are linked into (goes on PATH after ``node_bin_dir``)."""
    return Path(prefix or default_node_prefix()) / VENVS_DIR / ".bin"


def venv_dir(preset: HarnessPreset, prefix: str | os.PathLike[str] | None = None) -> Path:
    """The venv a Python agent is installed in."""
    return Path(prefix or default_node_prefix()) / VENVS_DIR / preset.name


def binary_path(preset: HarnessPreset, prefix: str | os.PathLike[str] | None = None) -> Path:
    return Path(prefix or default_node_prefix()) / preset.binary


def _dist_version(venv: Path, distribution: str) -> str | None:
    """The version of ``distribution`` installed in ``venv``, read from its ``.dist-info`` (no process)."""
    wanted = re.sub(r"[-_.]+", "_", distribution).lower()
    for info in venv.glob("lib/python*/site-packages/*.dist-info"):
        name, _, version = info.name[: -len(".dist-info")].partition("-")
        if re.sub(r"[-_.]+", "_", name).lower() == wanted and (info / "METADATA").is_file():
            return version or None
    return None


def installed_version(preset: HarnessPreset, prefix: str | os.PathLike[str] | None = None) -> str | None:
    """The version of the preset's package in the prefix (its ``package.json``, or for a Python agent
    its venv's ``.dist-info``), if it is there."""
    if preset.pip_package:
        return _dist_version(venv_dir(preset, prefix), preset.pip_package)
    manifest = Path(prefix or default_node_prefix()) / "node_modules" / preset.npm_package / "package.json"
    try:
        version = json.loads(manifest.read_text()).get("version")
    except (OSError, ValueError):
        return None
    return version if isinstance(version, str) else None


@dataclass(frozen=True)
class VersionProbe:
    """What ``<binary> --version`` did."""

    runs: bool
    output: str
    message: str


def probe_version(preset: HarnessPreset, binary: Path) -> VersionProbe:
    """Run ``binary --version`` offline, with a throwaway HOME (a probe must not write a real one).

    A Python agent whose ``version_probe`` is ``interpreter`` is asked through the interpreter beside
    its executable in the venv's ``bin`` (``python <version_argv>``)."""
    if not binary.exists():
        return VersionProbe(False, "", f"{binary} does not exist")
    program = binary.parent / "python" if preset.version_probe == "interpreter" else binary
    with tempfile.TemporaryDirectory(prefix="openenv-harness-probe-") as home:
        env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": os.environ.get("LANG", "C.UTF-8")}
        env.update(home_env(home))
        env.update(preset.offline_env)
        try:
            done = subprocess.run(
                [str(program), *preset.version_argv],
                env=env,
                cwd=home,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=_PROBE_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return VersionProbe(False, "", f"{binary} --version did not answer within {_PROBE_TIMEOUT_S:.0f} s")
        except OSError as exc:
            return VersionProbe(False, "", f"{binary} cannot be executed: {exc}")
    output = (done.stdout.strip() or done.stderr.strip()).splitlines()
    text = output[-1].strip() if output else ""
    if done.returncode != 0:
        detail = (done.stderr.strip() or done.stdout.strip() or "no output")[-500:]
        return VersionProbe(False, text, f"{binary} --version exited {done.returncode}: {detail}")
    return VersionProbe(True, text, "ok")


def _stamp_path(preset: HarnessPreset, prefix: Path) -> Path:
    return prefix / _STATE_DIR / f"{preset.name}.json"


def _binary_fingerprint(preset: HarnessPreset, prefix: Path) -> dict[str, object] | None:
    try:
        real = binary_path(preset, prefix).resolve(strict=True)
        stat = real.stat()
    except OSError:
        return None
    return {"spec": preset.install_spec, "binary": str(real), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _bin_link(preset: HarnessPreset, prefix: Path) -> Path | None:
    """Where a Python agent's executable is linked for PATH (``venvs/.bin/<bin_name>``); None for npm."""
    return venv_bin_dir(prefix) / preset.bin_name if preset.pip_package else None


def _linked(preset: HarnessPreset, prefix: Path) -> bool:
    link = _bin_link(preset, prefix)
    return link is None or (link.is_symlink() and link.resolve() == binary_path(preset, prefix).resolve())


def _link_bin(preset: HarnessPreset, prefix: Path) -> None:
    link = _bin_link(preset, prefix)
    if link is None or _linked(preset, prefix):
        return
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(binary_path(preset, prefix), link.parent))


def _stamp_matches(preset: HarnessPreset, prefix: Path) -> bool:
    if not _linked(preset, prefix):
        return False
    fingerprint = _binary_fingerprint(preset, prefix)
    try:
        stamp = json.loads(_stamp_path(preset, prefix).read_text())
    except (OSError, ValueError):
        return False
    return fingerprint is not None and stamp == fingerprint


def _verified(preset: HarnessPreset, prefix: Path) -> bool:
    """The pinned version is installed and answers ``--version``; stamps it when so."""
    if installed_version(preset, prefix) != preset.version:
        return False
    probe = probe_version(preset, binary_path(preset, prefix))
    if not probe.runs or preset.version_output not in probe.output:
        return False
    _link_bin(preset, prefix)
    stamp = _stamp_path(preset, prefix)
    stamp.parent.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(_binary_fingerprint(preset, prefix)) + "\n")
    return True


@contextmanager
def _prefix_lock(prefix: Path) -> Iterator[None]:
    """Serialize installers sharing a prefix (parallel test workers, CI jobs)."""
    state = prefix / _STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    with open(state / "install.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _npm_install(prefix: Path, specs: list[str]) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise InstallError("npm is not on PATH; install Node.js 20+ (with npm) to install the agent CLIs")
    argv = [
        npm, "install", "--prefix", str(prefix), "--save-exact", "--no-audit", "--no-fund",
        "--prefer-offline", "--loglevel=error", *specs,
    ]  # fmt: skip
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=_NPM_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise InstallError(f"npm install {' '.join(specs)} took longer than {_NPM_TIMEOUT_S:.0f} s") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-2000:]
        raise InstallError(f"npm install {' '.join(specs)} failed (exit {done.returncode}):\n{tail}")


def _pip_install(preset: HarnessPreset, prefix: Path) -> None:
    """``pip install package==version`` into the preset's own venv (created with this interpreter)."""
    venv = venv_dir(preset, prefix)
    python = venv / "bin" / "python"
    steps = [] if python.exists() else [[sys.executable, "-m", "venv", str(venv)]]
    steps.append([str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
                  "--quiet", preset.install_spec])
    for argv in steps:
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=_NPM_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise InstallError(f"python {' '.join(argv[1:])} took longer than {_NPM_TIMEOUT_S:.0f} s") from exc
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-2000:]
            raise InstallError(f"python {' '.join(argv[1:])} failed (exit {done.returncode}):\n{tail}")


def _run_postinstall(preset: HarnessPreset, prefix: Path) -> str:
    if not preset.postinstall:
        return ""
    done = subprocess.run(
        list(preset.postinstall), cwd=prefix, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600
    )
    return (done.stderr or done.stdout).strip()[-1000:]


def ensure_installed(
    names: Iterable[str] | None = None, prefix: str | os.PathLike[str] | None = None
) -> dict[str, Path]:
    """Install the named presets' pinned CLIs (all when ``names`` is None); ``{name: binary path}``.

    Raises ``UnknownHarnessError`` for an unknown name and ``InstallError`` when npm or pip fails or
    a binary does not run after installing.
    """
    if isinstance(names, str):
        names = [names]
    presets = [get_preset(name) for name in (preset_names() if names is None else list(names))]
    root = Path(prefix) if prefix is not None else default_node_prefix()
    root = root.expanduser().resolve()
    if all(_stamp_matches(p, root) for p in presets):
        return {p.name: binary_path(p, root) for p in presets}
    with _prefix_lock(root):
        missing = [p for p in presets if not _stamp_matches(p, root) and not _verified(p, root)]
        npm_specs = [p.npm_spec for p in missing if not p.pip_package]
        if npm_specs:
            _npm_install(root, npm_specs)
        for preset in missing:
            if preset.pip_package:
                _pip_install(preset, root)
        for preset in missing:
            if _verified(preset, root):
                continue
            repair = _run_postinstall(preset, root)
            if not _verified(preset, root):
                probe = probe_version(preset, binary_path(preset, root))
                found = installed_version(preset, root)
                raise InstallError(
                    f"{preset.name} {preset.version} does not run after installing into {root} "
                    f"(package version found: {found}): {probe.message}"
                    + (f"\npostinstall said: {repair}" if repair else "")
                )
    return {p.name: binary_path(p, root) for p in presets}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m openenv_harness.harnesses.install",
        description="Install the pinned agent CLIs into the project's node prefix.",
    )
    parser.add_argument("names", nargs="*", help=f"presets to install (default: all of {', '.join(preset_names())})")
    parser.add_argument(
        "--prefix", default=None, help=f"node prefix (default: ${PREFIX_ENV} or <repo>/.cache/harnesses)"
    )
    args = parser.parse_args(argv)
    try:
        paths = ensure_installed(args.names or None, args.prefix)
    except (InstallError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
