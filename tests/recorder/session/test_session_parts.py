"""A session's parts each have one owner: their state changes only through the owner's methods.

``LiveSession.replay`` (retry twins and recent digests), ``numbers`` (call numbers), ``ledger`` (what the
session spent against its caps), ``chain`` (fidelity tips, turn views, compaction summaries),
``dialect_memory``, ``prompt_reader`` and ``prompt_mode_state`` are objects of their own modules, built
with the session; the pipeline, the steps, the store's refusal, a close and a restart use their methods. The source check below reads every module of the package, so a step that reaches into a
part's private state, or swaps the part, fails here rather than in a race."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
from pathlib import Path

import pytest

import openenv_harness
from openenv_harness.recorder.session.budget import BudgetLedger, Counters
from openenv_harness.recorder.session.call_numbers import CallNumbers
from openenv_harness.recorder.chain.observer import ChainObserver
from openenv_harness.recorder.session.live import LiveSession
from openenv_harness.recorder.session.replay_window import ReplayWindow

PACKAGE = Path(openenv_harness.__file__).parent
#: the session's attribute -> the module that owns its state
PARTS = {"replay": "recorder/session/replay_window.py", "numbers": "recorder/session/call_numbers.py", "ledger": "recorder/session/budget.py",
         "chain": "recorder/chain/observer.py", "dialect_memory": "recorder/dialects/memory.py",
         "prompt_reader": "recorder/upstream/reply_parse.py", "prompt_mode_state": "recorder/prompt_modes/state.py"}
#: state a part lets others read, but which only its owner changes: attribute -> owner
READ_ONLY = {"counters": "recorder/session/budget.py"}


def _written(node: ast.AST) -> list[ast.expr]:
    """What a statement assigns to, and what a ``setattr`` call's first argument is."""
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
        return [ast.Attribute(value=node.args[0], attr="?", ctx=ast.Store())]
    return []


def _sources() -> list[tuple[str, ast.Module]]:
    """The recorder's modules: live sessions exist only there (elsewhere the names mean other things)."""
    return [(str(p.relative_to(PACKAGE)), ast.parse(p.read_text(), str(p)))
            for p in sorted((PACKAGE / "recorder").rglob("*.py"))]


def _breaches(name: str, tree: ast.AST) -> list[str]:
    """Where module ``name`` reaches into a part's private state, replaces a part, or changes read-only state."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and isinstance(node.value, ast.Attribute) and node.value.attr in PARTS):
            found.append(f"{name}:{node.lineno} reads .{node.value.attr}.{node.attr}")
        for target in _written(node):
            if not isinstance(target, ast.Attribute):
                continue
            if target.attr in PARTS and name != "recorder/session/live.py":
                found.append(f"{name}:{getattr(node, 'lineno', 0)} replaces .{target.attr}")
            inner = target.value
            for attr, owner in READ_ONLY.items():
                if name != owner and (target.attr == attr or (isinstance(inner, ast.Attribute) and inner.attr == attr)):
                    found.append(f"{name}:{getattr(node, 'lineno', 0)} changes .{attr}")
    return found


def test_no_module_reaches_into_a_parts_private_state_or_replaces_the_part() -> None:
    assert [b for name, tree in _sources() for b in _breaches(name, tree)] == []


def test_the_parts_state_lives_only_in_their_owners() -> None:
    fields = {f.name for f in dataclasses.fields(LiveSession)}
    assert set(PARTS) <= fields
    assert not fields & {"inflight", "recent_digests", "next_call_index", "counters", "caps_cache", "fidelity",
                         "turn_views", "compaction_summaries"}, "part state back on the session"
    assert ReplayWindow.__slots__ == ("_recent", "_twins") and CallNumbers.__slots__ == ("_next",)
    assert BudgetLedger.__slots__ == ("_budgets", "_caps", "counters")
    assert [f.name for f in dataclasses.fields(ChainObserver)] == ["tips", "budget", "_views", "_summaries"]
    owners = {name for name, _ in _sources()}
    assert set(PARTS.values()) <= owners


def test_the_source_check_finds_a_breach() -> None:
    """The check above can fail: each kind of breach, in a module that does not own the part."""
    tree = ast.parse("def f(s):\n    s.replay._recent.clear()\n    s.numbers = None\n"
                     "    s.counters.calls += 1\n    setattr(s.counters, 'calls', 0)\n")
    assert sorted(b.split(" ", 1)[1] for b in _breaches("recorder/call/x.py", tree)) == [
        "changes .counters", "changes .counters", "reads .replay._recent", "replaces .numbers"]
    assert _breaches("recorder/session/budget.py", ast.parse("def f(s):\n    s.counters.calls += 1\n")) == []


def test_the_ledger_counts_records_refunds_and_cuts_tool_calls() -> None:
    from array import array

    from openenv_harness.recorder.session.spec import Budgets
    from openenv_harness.recorder.validate import Evidence

    ledger = BudgetLedger(Budgets(max_agent_calls=2, max_total_tool_calls=3, max_tool_calls_per_turn=2))
    ev = Evidence(prompt_ids=array("I", [1, 2, 3]), completion_ids=array("I", [4]))
    ledger.account("agent", ev, served=True)
    ledger.account("aux", None, served=False)  # a failed aux call: a record, nothing served
    assert ledger.counters == Counters(calls=2, agent_calls=1, prompt_tokens=3, completion_tokens=1)
    assert ledger.exceeded("agent", 0.0) is None
    ledger.account("agent", ev, served=True)
    assert ledger.exceeded("agent", 0.0) == "max_agent_calls" and ledger.exceeded("aux", 0.0) is None
    ledger.refund("agent", ev, served=True)  # its record could not be stored
    assert ledger.counters == Counters(calls=2, agent_calls=1, prompt_tokens=3, completion_tokens=1)
    assert ledger.allow_tool_calls(5) == (2, "max_tool_calls_per_turn")
    assert ledger.allow_tool_calls(2) == (1, "max_total_tool_calls")
    assert ledger.allow_tool_calls(1) == (0, "max_total_tool_calls") and ledger.counters.tool_calls == 3
    limits = ledger.limits(1.23456, "max_total_tool_calls")
    assert limits["elapsed_s"] == 1.235 and limits["stop"] == "max_total_tool_calls" and limits["max_agent_calls"] == 2
    ledger.restore({"calls": "7", "not_a_counter": 1, "__class__": 0})
    assert ledger.counters.calls == 7


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
    assert window.first_attempt("d") is None
    first = window.open_twin("d")
    assert window.first_attempt("d") is first and not first.done()
    second = window.open_twin("d")  # a later attempt of the same body took its place
    window.close_twin("d", first)
    assert window.first_attempt("d") is second
    window.close_twin("d", second)
    assert window.first_attempt("d") is None
    assert asyncio.get_running_loop() is first.get_loop()


@pytest.mark.parametrize("window_size", [0, 1, 3])
def test_recent_digests_keep_the_window_latest(window_size: int) -> None:
    window = ReplayWindow()
    for i in range(5):
        window.remember(f"d{i}", i, window_size)
    kept = {f"d{i}": window.first_attempt(f"d{i}") for i in range(5) if window.first_attempt(f"d{i}") is not None}
    assert kept == {f"d{i}": i for i in range(5 - window_size, 5)} and len(window) == window_size
    window.forget_recent()
    assert len(window) == 0 and window.first_attempt("d4") is None


async def test_a_twin_in_flight_is_the_first_attempt_before_a_recent_record() -> None:
    window = ReplayWindow()
    window.remember("d", 7, 4)
    twin = window.open_twin("d")  # a retry of a recorded body that is being sampled again
    assert window.first_attempt("d") is twin
    window.close_twin("d", twin)
    assert window.first_attempt("d") == 7


def test_every_part_is_built_with_the_session_and_a_close_empties_it() -> None:
    """No part is made on first use (a lazy ``is None`` construction is a replacement, caught above):
    a fresh session has them all, and a closed one keeps none of their contents."""
    from array import array

    from openenv_harness.recorder.session.spec import SessionSpec
    from openenv_harness.recorder.upstream.span_budget import SpanBudget

    budget = SpanBudget(1 << 20)
    session = LiveSession(id="s", secret_digest="d", spec=SessionSpec(), created_at=0.0, span_budget=budget)
    assert all(getattr(session, part) is not None for part in PARTS)
    session.chain.observe("s/0", array("I", [1, 2, 3]), array("I", [4]))
    session.chain.note_compaction("summary")
    session.dialect_memory.remember_call("c", "{}", {})
    session.replay.remember("d", 0, 4)
    assert budget.total_bytes > 0 and session.chain.tip_ids == ["s/0"]
    session.release_caches()
    assert session.chain.tip_ids == [] and session.chain.summaries == () and len(session.dialect_memory) == 0
    assert len(session.replay) == 0 and budget.total_bytes == 0
