"""Every command and flag the README's command list names exists: a user copying from it never meets
'No such option'."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import typer

from openenv_harness.cli.app import app

README = Path(__file__).resolve().parents[2] / "README.md"


def _command_block() -> list[str]:
    text = README.read_text()
    start = text.index("## The command line")
    block = text[start:].split("```bash", 1)[1].split("```", 1)[0]
    lines: list[str] = []
    for line in block.splitlines():
        if line.startswith((" ", "\t")) and lines:  # a continuation of the command above
            lines[-1] += " " + line.strip()
        elif line.strip():
            lines.append(line.strip())
    return lines


def _click_options(path: list[str]) -> set[str]:
    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return {opt for param in command.params for opt in getattr(param, "opts", [])}


def test_every_openenv_harness_command_and_flag_in_the_readme_exists() -> None:
    lines = [line for line in _command_block() if line.startswith("openenv-harness ")]
    assert len(lines) >= 7, "the README's command list is where this test looks"
    for line in lines:
        words = line.split()[1:]
        path = [words[0]] + ([words[1]] if words[0] in ("trace", "space", "tasks") else [])
        flags = set(re.findall(r"(--[a-z][a-z0-9-]*)", line))
        missing = flags - _click_options(path)
        assert not missing, f"`openenv-harness {' '.join(path)}` has no {sorted(missing)} (README: {line})"


def test_every_python_module_command_in_the_readme_takes_its_flags() -> None:
    lines = [line for line in _command_block() if line.startswith("python -m ")]
    assert lines, "the README names module commands"
    for line in lines:
        module = line.split()[2]
        verbs = re.findall(r"\b(setup|serve|status)\b", line.split("(")[0])
        helps = [subprocess.run([sys.executable, "-m", module, *([verb] if verb else []), "--help"],
                                capture_output=True, text=True, timeout=120) for verb in (verbs or [None])]
        text = " ".join(h.stdout for h in helps)
        assert all(h.returncode == 0 for h in helps), [h.stderr for h in helps]
        flags = set(re.findall(r"(--[a-z][a-z0-9-]*)", line.split("(")[0]))
        assert all(flag in text for flag in flags), f"{module}: {sorted(f for f in flags if f not in text)}"
