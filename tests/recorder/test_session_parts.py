"""A session's parts each have one owner: their state changes only through the owner's methods.

``LiveSession.replay`` (retry twins and recent digests) and ``LiveSession.numbers`` (call numbers) are
objects of their own modules; the pipeline, the record step, the store's refusal and a close use their
methods. The source check below reads every module of the package, so a step that reaches into a
part's private state, or swaps the part, fails here rather than in a race."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
from pathlib import Path

import pytest

import openenv_harness
from openenv_harness.recorder.call_numbers import CallNumbers
from openenv_harness.recorder.live_session import LiveSession
from openenv_harness.recorder.replay_window import ReplayWindow

PACKAGE = Path(openenv_harness.__file__).parent
#: the session's attribute -> the module that owns its state
PARTS = {"replay": "recorder/replay_window.py", "numbers": "recorder/call_numbers.py"}


def _sources() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(PACKAGE)), ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE.rglob("*.py"))]


def test_no_module_reaches_into_a_parts_private_state_or_replaces_the_part() -> None:
    breaches = []
    for name, tree in _sources():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and isinstance(node.value, ast.Attribute) and node.value.attr in PARTS):
                breaches.append(f"{name}:{node.lineno} reads .{node.value.attr}.{node.attr}")
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in PARTS and name != "recorder/live_session.py":
                    breaches.append(f"{name}:{node.lineno} replaces .{target.attr}")
    assert breaches == []


def test_the_parts_state_lives_only_in_their_owners() -> None:
    fields = {f.name for f in dataclasses.fields(LiveSession)}
    assert {"replay", "numbers"} <= fields
    assert not fields & {"inflight", "recent_digests", "next_call_index"}, "part state back on the session"
    assert ReplayWindow.__slots__ == ("_recent", "_twins") and CallNumbers.__slots__ == ("_next",)
    owners = {name for name, _ in _sources()}
    assert set(PARTS.values()) <= owners


def test_the_source_check_finds_a_breach() -> None:
    """The check above can fail: the same walk over a module that reaches in and one that swaps a part."""
    tree = ast.parse("def f(s):\n    s.replay._recent.clear()\n    s.numbers = None\n")
    reached = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr.startswith("_")
               and isinstance(n.value, ast.Attribute) and n.value.attr in PARTS]
    swapped = [t for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
               if isinstance(t, ast.Attribute) and t.attr in PARTS]
    assert len(reached) == 1 and len(swapped) == 1


def test_call_numbers_are_taken_in_order_and_only_the_latest_goes_back() -> None:
    numbers = CallNumbers(3)
    assert numbers.next == 3
    first, second = numbers.take(), numbers.take()
    assert (first, second, numbers.next) == (3, 4, 5)
    assert numbers.give_back(first) is False and numbers.next == 5  # a later call holds 4: 3 stays taken
    assert numbers.give_back(second) is True and numbers.next == 4
    assert numbers.take() == 4


async def test_a_twin_is_closed_only_by_the_call_that_opened_it() -> None:
    window = ReplayWindow()
    assert window.twin("d") is None
    first = window.open_twin("d")
    assert window.twin("d") is first and not first.done()
    second = window.open_twin("d")  # a later attempt of the same body took its place
    window.close_twin("d", first)
    assert window.twin("d") is second
    window.close_twin("d", second)
    assert window.twin("d") is None
    assert asyncio.get_running_loop() is first.get_loop()


@pytest.mark.parametrize("window_size", [0, 1, 3])
def test_recent_digests_keep_the_window_latest(window_size: int) -> None:
    window = ReplayWindow()
    for i in range(5):
        window.remember(f"d{i}", i, window_size)
    kept = [f"d{i}" for i in range(5) if window.is_recent(f"d{i}")]
    assert kept == [f"d{i}" for i in range(5 - window_size, 5)] and len(window) == window_size
    window.forget_recent()
    assert len(window) == 0 and not window.is_recent("d4")
