"""Run one prepared agent task inside a sandbox: place the preset's files, run, read the outcome.

Why it is separate from the presets: a preset is pure data and functions (testable without a
process); this is the one place that touches a ``Sandbox``. The rollout layer may use it as is for
blocking runs, or use ``place_files`` and ``Sandbox.start`` for runs it supervises itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from openenv_harness.harnesses.base import HarnessPreset, HarnessResult, HarnessSetup, LaunchSpec
from openenv_harness.sandbox.base import CommandResult, Sandbox


@dataclass(frozen=True)
class HarnessRun:
    """What one run placed, what the process did, and what it means."""

    spec: LaunchSpec
    command: CommandResult
    result: HarnessResult


def place_files(sandbox: Sandbox, spec: LaunchSpec) -> dict[str, str]:
    """Write the spec's config files into the sandbox; returns their sha256 (provenance)."""
    for path, content in spec.files.items():
        sandbox.write_file(path, content)
    return spec.config_hashes()


def run_once(
    preset: HarnessPreset,
    sandbox: Sandbox,
    setup: HarnessSetup,
    prompt: str,
    *,
    timeout_s: float,
    executable: str | None = None,
) -> HarnessRun:
    """Prepare, place and run one headless task to completion (killed after ``timeout_s``)."""
    spec = preset.prepare(setup, prompt, executable)
    place_files(sandbox, spec)
    command = sandbox.run(spec.argv, env=spec.env, cwd=spec.cwd, stdin=spec.stdin, timeout_s=timeout_s)
    result = preset.parse_output(command.exit_code, command.stdout, command.stderr)
    return HarnessRun(spec=spec, command=command, result=result)
