"""``benchmarks/profile_recorder.py`` sorts py-spy's samples by the frames it names: a rule naming a
function or file the recorder no longer has would silently send its samples to a catch-all bucket."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import profile_recorder

import openenv_harness

ROOT = Path(openenv_harness.__file__).parent.parent
#: py-spy's frame text: ``qualname (path``
NAMED = re.compile(r"^(?P<name>[\w.]+) \((?P<path>openenv_harness/[\w/]+\.py)$")


def _defined(path: Path) -> set[str]:
    """Every function's and class's qualified name in ``path`` (``Class.method`` for methods)."""
    names: set[str] = set()

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(prefix + child.name)
                walk(child, prefix + child.name + ".")

    walk(ast.parse(path.read_text()), "")
    return names


def test_every_rule_names_recorder_code_that_exists() -> None:
    stale = []
    for needle, _ in profile_recorder.FRAME_RULES:
        named = NAMED.match(needle)
        if named is not None:
            path = ROOT / named["path"]
            # a needle matches as a substring: ``enter (`` also matches ``ChatDialect.enter (``
            name = named["name"]
            if not path.is_file() or not any(q == name or q.endswith("." + name) for q in _defined(path)):
                stale.append(needle)
        elif needle.startswith("openenv_harness/") and not (ROOT / needle).exists():
            stale.append(needle)
    assert stale == []


def test_the_check_finds_a_stale_rule() -> None:
    path = ROOT / "openenv_harness/recorder/call/pending.py"
    assert "served_record" in _defined(path) and "chat_route" not in _defined(path)
    assert NAMED.match("chat_route (openenv_harness/recorder/app.py") is not None
