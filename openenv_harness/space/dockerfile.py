"""Just enough of a Dockerfile to know what an image copies, sets and runs.

The Space folder is built from what the environment's Dockerfile copies (so the folder and the image
cannot disagree), and the local validation provider starts the image's own ``CMD`` with its ``ENV``.
"""

from __future__ import annotations

import fnmatch
import json
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def parse_dockerfile(path: Path) -> list[Instruction]:
    """Instructions in order, continuation lines joined, comments and blank lines dropped."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not pending and not line):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = pending + line
        pending = ""
        keyword, _, args = text.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip()))
    return instructions


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    starts = [i for i, ins in enumerate(instructions) if ins.keyword == "FROM"]
    if not starts:
        raise ValueError("a Dockerfile needs a FROM")
    return instructions[starts[-1]:]


def copied_sources(instructions: list[Instruction]) -> list[str]:
    """The build-context paths the ``COPY`` instructions take (not those copied from another stage)."""
    sources: list[str] = []
    for ins in instructions:
        if ins.keyword == "COPY" and not ins.args.startswith("--from"):
            sources += [s for s in shlex.split(ins.args)[:-1] if not s.startswith("--")]
    return sources


def image_env(stage: list[Instruction]) -> dict[str, str]:
    """The ``ENV`` the stage sets, in order (later values win)."""
    env: dict[str, str] = {}
    for ins in stage:
        if ins.keyword != "ENV":
            continue
        parts = shlex.split(ins.args)
        if parts and "=" not in parts[0]:  # the legacy form: ENV KEY value with spaces
            env[parts[0]] = " ".join(parts[1:])
            continue
        for part in parts:
            key, _, value = part.partition("=")
            env[key] = value
    return env


def image_cmd(stage: list[Instruction]) -> list[str]:
    cmds = [ins for ins in stage if ins.keyword == "CMD"]
    if len(cmds) != 1:
        raise ValueError(f"expected one CMD in the final stage, found {len(cmds)}")
    argv = json.loads(cmds[0].args)
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"CMD must be in exec form (a JSON list of strings), got {cmds[0].args}")
    return argv


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether a context-relative path is excluded by ``.dockerignore`` patterns: a pattern matches the path
    or one of its parent folders from the context's root; ``**/NAME`` matches NAME at any depth."""
    parts = PurePosixPath(path).parts
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatchcase(part, pattern[3:]) for part in parts):
                return True
        elif any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
            return True
    return False


def ignore_patterns(path: Path) -> list[str]:
    if not path.is_file():
        return []
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
