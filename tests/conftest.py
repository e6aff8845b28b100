"""Hooks for the whole test tree.

A test file whose module-level marks already rule it out of ``-m`` is not imported at all. pytest
would import it to read those marks and then deselect every test in it; with pytest-xdist each worker
collects the whole tree, so the imports a real-engine or agent-CLI file needs (TRL's async GRPO, for
one) were paid once per worker in every fast-tier run, for no test.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest


def module_marks(source: str) -> set[str] | None:
    """The names in a module-level ``pytestmark = pytest.mark.X`` (or a list of them); None when the
    file has no such assignment or it is not plain enough to read without importing."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return {sub.attr for sub in ast.walk(node.value) if isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark"
                    and isinstance(sub.value.value, ast.Name) and sub.value.value.id == "pytest"}
    return None


def _names(expression: ast.expr) -> set[str] | None:
    """The marker names of a plain ``-m`` expression (names, and, or, not, parentheses); None otherwise."""
    names: set[str] = set()
    for node in ast.walk(expression):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif not isinstance(node, ast.BoolOp | ast.UnaryOp | ast.And | ast.Or | ast.Not | ast.Load):
            return None
        elif isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not):
            return None
    return names


def excluded_whatever_else(markexpr: str, marks: set[str]) -> bool:
    """Whether ``markexpr`` is false for every test carrying ``marks``, whatever other marks each test
    (or a conftest) adds: every assignment of the expression's other names is tried."""
    try:
        tree = ast.parse(markexpr, mode="eval")
    except SyntaxError:
        return False
    names = _names(tree.body)
    if names is None:
        return False
    code = compile(tree, "<-m>", "eval")
    free = sorted(names - marks)
    for values in itertools.product((False, True), repeat=len(free)):
        scope = {name: name in marks for name in names} | dict(zip(free, values, strict=True))
        if eval(code, {"__builtins__": {}}, scope):  # noqa: S307 -- names and boolean operators only
            return False
    return True


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    markexpr = config.getoption("markexpr", default="")
    if not markexpr or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    try:
        marks = module_marks(collection_path.read_text(encoding="utf-8"))
    except OSError:
        return None
    if marks is not None and excluded_whatever_else(markexpr, marks):
        return True
    return None
