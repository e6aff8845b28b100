"""Budgets: what a session may spend (D13), what it has spent, and tool-call caps on each reply.

The steps that apply them are ``call/admit.py: enforce_budget`` (before a call) and ``call/forward.py: apply_tool_caps``
(on its reply); this module's ``BudgetLedger`` is the session's ledger they share with the record
step, and the one place its counters change.

A black-box agent never stops on its own, so the recorder does: max agent calls, max calls, max
tokens (prompt and completion counted separately, plus a total), max wall-clock. The cap that
stopped a session becomes its stop condition (on the session and in every later record's
``limits``). The agent is answered with a 400 -- both supported CLIs end promptly on a 400, with
no retry storm -- and nothing synthetic is ever recorded as a policy sample.

Tool-call caps (RFC 005's ``max_tool_calls_per_turn`` and ``max_total_tool_calls``) cannot be
checked before a call: they are about what the reply asks for. The recorder sees every reply
before the agent does, so the tool-caps step (``call/forward.py: apply_tool_caps``) applies them there, the way OpenEnv's own
``MCPHarnessAdapter`` does for a white-box loop -- the calls beyond a cap are never executed:

- ``max_tool_calls_per_turn``: the agent receives the reply with its first N tool calls; the
  others are dropped and the session goes on.
- ``max_total_tool_calls``: the agent receives the tool calls that still fit (possibly none: then
  the reply reaches it without tool calls and ``finish_reason`` ``stop``, so it ends its turn) and
  the session is stopped with that cap as its stop reason: the agent runs the calls it received,
  and its next model call is refused with the usual 400.

The record keeps the policy's sample untouched (its completion ids hold every sampled call); its
``response`` is what the agent received, and ``metadata.tool_limit`` names the cap, the counts and
the dropped calls verbatim, so nothing is lost and a retried call is replayed exactly as cut.

What each cap counts (``BudgetLedger.account``):

* ``max_calls``: records -- every call the engine was asked, whether it served it or not (a failed
  record counts: an agent that loops on calls the engine rejects must still end, and ``limits.calls``
  is then the number of the session's records);
* ``max_agent_calls``: agent calls the engine served (``ok`` and ``invalid`` records of kind agent);
* the token caps: the prompt and completion ids of served calls;
* nothing: calls refused before the engine (bad input, authentication, a paused engine, a cap),
  replayed retries (no new sample), and calls whose record could not be stored (``BudgetLedger.refund``).

``n`` must be the integer 1 (``call/admit.py: parse``): a budget counts calls, and one call is one sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from openenv_harness.recorder.session.spec import Budgets
from openenv_harness.recorder.validate import Evidence


@dataclass
class Counters:
    calls: int = 0
    agent_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failed_calls: int = 0
    invalid_calls: int = 0
    replayed_calls: int = 0
    #: tool calls handed to the agent (after any cut), the count ``max_total_tool_calls`` caps
    tool_calls: int = 0


_COUNTER_NAMES = frozenset(f.name for f in fields(Counters))


class BudgetLedger:
    """One session's spending against its caps. ``counters`` is read by summaries and exports; it
    changes only through these methods (``tests/recorder/session/test_session_parts.py`` reads the sources)."""

    __slots__ = ("_budgets", "_caps", "counters")

    def __init__(self, budgets: Budgets) -> None:
        self._budgets = budgets
        self._caps: dict[str, Any] | None = None
        self.counters = Counters()

    def exceeded(self, call_kind: str, elapsed_s: float) -> str | None:
        """The name of the first cap a call of ``call_kind`` would exceed, ``elapsed_s`` into the session."""
        b = self._budgets
        c = self.counters
        if b.max_wall_clock_s is not None and elapsed_s >= b.max_wall_clock_s:
            return "max_wall_clock_s"
        if b.max_calls is not None and c.calls >= b.max_calls:
            return "max_calls"
        if call_kind == "agent" and b.max_agent_calls is not None and c.agent_calls >= b.max_agent_calls:
            return "max_agent_calls"
        if b.max_prompt_tokens is not None and c.prompt_tokens >= b.max_prompt_tokens:
            return "max_prompt_tokens"
        if b.max_completion_tokens is not None and c.completion_tokens >= b.max_completion_tokens:
            return "max_completion_tokens"
        if b.max_total_tokens is not None and c.prompt_tokens + c.completion_tokens >= b.max_total_tokens:
            return "max_total_tokens"
        return None

    def refund(self, call_kind: str, evidence: Evidence | None, *, served: bool) -> None:
        """Undo ``account`` for a call whose record could not be stored: a budget counts records."""
        self.account(call_kind, evidence, served=served, sign=-1)

    def account(self, call_kind: str, evidence: Evidence | None, *, served: bool, sign: int = 1) -> None:
        """A record of this call is being stored: it counts (``sign=-1``: ``refund``)."""
        c = self.counters
        c.calls += sign
        if not served or evidence is None:
            return
        if call_kind == "agent":
            c.agent_calls += sign
        if evidence.prompt_ids is not None:
            c.prompt_tokens += sign * len(evidence.prompt_ids)
        if evidence.completion_ids is not None:
            c.completion_tokens += sign * len(evidence.completion_ids)

    def allow_tool_calls(self, requested: int) -> tuple[int, str | None]:
        """How many of a reply's ``requested`` tool calls the agent may receive, and the cap that cut
        them (None: all of them); the allowed ones count against ``max_total_tool_calls``."""
        b = self._budgets
        left = None if b.max_total_tool_calls is None else max(0, b.max_total_tool_calls - self.counters.tool_calls)
        allowed, cap = requested, None
        if b.max_tool_calls_per_turn is not None and allowed > b.max_tool_calls_per_turn:
            allowed, cap = b.max_tool_calls_per_turn, "max_tool_calls_per_turn"
        if left is not None and allowed > left:
            allowed, cap = left, "max_total_tool_calls"
        self.counters.tool_calls += allowed
        return allowed, cap

    def note_replayed(self) -> None:
        self.counters.replayed_calls += 1

    def note_invalid(self) -> None:
        self.counters.invalid_calls += 1

    def note_failed(self) -> None:
        self.counters.failed_calls += 1

    def restore(self, totals: Mapping[str, Any]) -> None:
        """The counters a stored session row carries (a restarted recorder); unknown names are skipped."""
        for key, value in totals.items():
            if key in _COUNTER_NAMES:
                setattr(self.counters, key, int(value))

    def limits(self, elapsed_s: float, stop_reason: str | None) -> dict[str, Any]:
        """What each record's ``limits`` shows: the counts so far, the caps, and the stop condition."""
        c = self.counters
        caps = self._caps
        if caps is None:  # a pydantic dump per call cost more than the rest of this method
            caps = self._caps = self._budgets.model_dump(exclude_none=True)
        return {
            "agent_calls": c.agent_calls,
            "calls": c.calls,
            "prompt_tokens": c.prompt_tokens,
            "completion_tokens": c.completion_tokens,
            "tool_calls": c.tool_calls,
            "elapsed_s": round(elapsed_s, 3),
            **caps,
            "stop": stop_reason,
        }
