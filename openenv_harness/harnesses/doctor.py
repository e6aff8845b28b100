"""Say, per preset, whether its CLI is installed, which version it is, and whether it runs.

Why a doctor and not just the installer: a rollout that fails because ``node`` is missing or the
OpenCode launcher is a postinstall stub fails minutes later with an opaque agent exit code; the
doctor names the problem and the command that fixes it, without installing anything.

Run ``python -m openenv_harness.harnesses.doctor [names...] [--prefix DIR]`` (exit 1 unless all ok).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from openenv_harness.harnesses.install import (
    binary_path,
    default_node_prefix,
    installed_version,
    probe_version,
)
from openenv_harness.harnesses.registry import get_preset, preset_names


@dataclass(frozen=True)
class HarnessStatus:
    """One preset's state in one node prefix."""

    name: str
    expected_version: str
    binary: str
    installed: bool
    version: str | None
    runs: bool
    message: str
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.installed and self.runs and self.version == self.expected_version


def _check(name: str, prefix: Path) -> HarnessStatus:
    preset = get_preset(name)
    binary = binary_path(preset, prefix)
    fix = f"run: python -m openenv_harness.harnesses.install {name} --prefix {prefix}"
    notes = [
        f"{tool!r} is not on PATH; the agent's tools will try to download it" for tool in preset.recommends
        if shutil.which(tool) is None
    ]  # fmt: skip

    def status(installed: bool, version: str | None, runs: bool, message: str) -> HarnessStatus:
        return HarnessStatus(name, preset.version, str(binary), installed, version, runs, message, notes)

    package_version = installed_version(preset, prefix)
    if package_version is None or not binary.exists():
        return status(False, None, False, f"not installed in {prefix}; {fix}")
    missing = [tool for tool in preset.requires if shutil.which(tool) is None]
    if missing:
        message = f"installed, but {', '.join(missing)} is not on PATH, so it cannot start"
        return status(True, package_version, False, message)
    probe = probe_version(preset, binary)
    if not probe.runs:
        return status(True, package_version, False, f"does not run: {probe.message}; {fix}")
    version = probe.output or package_version
    if preset.version_output not in version:
        return status(True, version, True, f"version {version} found, {preset.version} pinned; {fix}")
    return status(True, preset.version, True, "ok")


def doctor(names: Iterable[str] | None = None, prefix: str | os.PathLike[str] | None = None) -> list[HarnessStatus]:
    """The status of each named preset (all when ``names`` is None); installs nothing."""
    if isinstance(names, str):
        names = [names]
    root = Path(prefix).expanduser().resolve() if prefix is not None else default_node_prefix()
    return [_check(name, root) for name in (preset_names() if names is None else list(names))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m openenv_harness.harnesses.doctor", description="Check the agent CLIs."
    )
    parser.add_argument("names", nargs="*", help="presets to check (default: all)")
    parser.add_argument("--prefix", default=None, help="node prefix to check")
    args = parser.parse_args(argv)
    try:
        statuses = doctor(args.names or None, args.prefix)
    except KeyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for status in statuses:
        mark = "ok " if status.ok else "BAD"
        print(f"[{mark}] {status.name} {status.version or '-'} (pinned {status.expected_version}): {status.message}")
        for note in status.notes:
            print(f"      note: {note}")
    return 0 if all(status.ok for status in statuses) else 1


if __name__ == "__main__":
    raise SystemExit(main())
