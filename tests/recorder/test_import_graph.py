"""The recorder's modules import one another without a circle, and each imports on its own.

Why a test: a circle is how a flow's steps came to import the flow's runner back, and how wiring
came to depend on side effects; one added import brings it back. The graph is read from the
sources (``TYPE_CHECKING`` imports included: a type-only circle is still a circle a reader
follows), and every module is imported alone in a fresh interpreter, which finds the circles a
package's ``__init__`` can make at run time.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import openenv_harness

PACKAGE = Path(openenv_harness.__file__).parent
RECORDER = "openenv_harness.recorder"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if not name.startswith(RECORDER):
            continue
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from pkg import sub`` depends on the submodule, not on the package's __init__
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges.update(t for t in targets if t.startswith(RECORDER) and t in modules and t != name)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_inside_the_recorder() -> None:
    graph = _graph()
    assert len(graph) > 80  # the whole package was read
    assert _circles(graph) == []


@pytest.mark.slow
def test_every_recorder_module_imports_on_its_own() -> None:
    names = sorted(n for n in _modules() if n.startswith(RECORDER))
    script = ("import importlib, subprocess, sys\n"
              "bad = []\n"
              "for name in sys.argv[1:]:\n"
              "    r = subprocess.run([sys.executable, '-c', f'import {name}'], capture_output=True, text=True)\n"
              "    if r.returncode:\n"
              "        bad.append(name + ': ' + r.stderr.strip().splitlines()[-1])\n"
              "print('\\n'.join(bad))\n")
    result = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_no_step_imports_the_recorders_context() -> None:
    """The steps see the recorder through ``call/services.py``; the context (and its session registry)
    is not theirs to import, not even for a type."""
    graph = _graph()
    steps = {n for n in graph if n.startswith(f"{RECORDER}.call.")}
    assert {f"{RECORDER}.call.{m}" for m in ("admit", "forward", "record", "pending", "pipeline")} <= steps
    assert sorted(n for n in steps if f"{RECORDER}.context" in graph[n]) == []
    assert f"{RECORDER}.context" in graph[f"{RECORDER}.app"]  # the graph sees such an import where there is one


def test_prompt_modes_see_a_call_not_the_flow() -> None:
    """A prompt mode is given a ``ModeCall`` (the request, its state, the engine's facts): no mode
    module imports the call's steps, the flow, the session or the recorder's context, not even for a type."""
    graph = _graph()
    modes = {n for n in graph if n.startswith(f"{RECORDER}.prompt_modes.")}
    assert len(modes) > 8
    outside = (f"{RECORDER}.call", f"{RECORDER}.session", f"{RECORDER}.context")
    assert sorted((n, t) for n in modes for t in graph[n] if t.startswith(outside)) == []
    assert f"{RECORDER}.prompt_modes.base" in graph[f"{RECORDER}.call.forward"]  # the graph sees the mode's imports


def test_the_flow_loads_only_data_modules() -> None:
    """Importing the call as data loads no step, no store and no server: a step test or a reader of
    ``flow.py`` meets plain data (what its fields hold is imported for type checking only)."""
    script = ("import sys, openenv_harness.recorder.call.flow\n"
              "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('openenv_harness'))))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.split())
    assert loaded == {"openenv_harness", "openenv_harness.version", RECORDER, f"{RECORDER}.call",
                      f"{RECORDER}.call.flow", f"{RECORDER}.dialects", f"{RECORDER}.dialects.dialect_call"}
