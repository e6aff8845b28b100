"""Budgets: what a session may spend (D13), what it has spent, and tool-call caps on each reply.

The steps that apply them are ``call/enforce_budget.py`` (before a call) and ``call/tool_caps.py``
(on its reply); this module is the session's ledger they share with the record step.

A black-box agent never stops on its own, so the recorder does: max agent calls, max calls, max
tokens (prompt and completion counted separately, plus a total), max wall-clock. The cap that
stopped a session becomes its stop condition (on the session and in every later record's
``limits``). The agent is answered with a 400 -- both supported CLIs end promptly on a 400, with
no retry storm -- and nothing synthetic is ever recorded as a policy sample.

Tool-call caps (RFC 005's ``max_tool_calls_per_turn`` and ``max_total_tool_calls``) cannot be
checked before a call: they are about what the reply asks for. The recorder sees every reply
before the agent does, so the tool-caps step (``call/tool_caps.py``) applies them there, the way OpenEnv's own
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

What each cap counts (``account``):

* ``max_calls``: records -- every call the engine was asked, whether it served it or not (a failed
  record counts: an agent that loops on calls the engine rejects must still end, and ``limits.calls``
  is then the number of the session's records);
* ``max_agent_calls``: agent calls the engine served (``ok`` and ``invalid`` records of kind agent);
* the token caps: the prompt and completion ids of served calls;
* nothing: calls refused before the engine (bad input, authentication, a paused engine, a cap),
  replayed retries (no new sample), and calls whose record could not be stored (``refund``).

``n`` must be the integer 1 (``call/parse.py``): a budget counts calls, and one call is one sample.
"""

from __future__ import annotations

import time
from typing import Any

from openenv_harness.recorder.live_session import LiveSession
from openenv_harness.recorder.validate import Evidence


def exceeded(session: LiveSession, call_kind: str, now: float | None = None) -> str | None:
    """The name of the first cap this call would exceed, or None."""
    b = session.spec.budgets
    c = session.counters
    now = time.time() if now is None else now
    if b.max_wall_clock_s is not None and now - session.created_at >= b.max_wall_clock_s:
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


def account(session: LiveSession, call_kind: str, evidence: Evidence | None, *, served: bool) -> None:
    c = session.counters
    c.calls += 1
    if not served or evidence is None:
        return
    if call_kind == "agent":
        c.agent_calls += 1
    if evidence.prompt_ids is not None:
        c.prompt_tokens += len(evidence.prompt_ids)
    if evidence.completion_ids is not None:
        c.completion_tokens += len(evidence.completion_ids)


def refund(session: LiveSession, call_kind: str, evidence: Evidence | None, *, served: bool) -> None:
    """Undo ``account`` for a call whose record could not be stored: a budget counts records."""
    c = session.counters
    c.calls -= 1
    if not served or evidence is None:
        return
    if call_kind == "agent":
        c.agent_calls -= 1
    if evidence.prompt_ids is not None:
        c.prompt_tokens -= len(evidence.prompt_ids)
    if evidence.completion_ids is not None:
        c.completion_tokens -= len(evidence.completion_ids)


def limits_state(session: LiveSession) -> dict[str, Any]:
    c = session.counters
    caps = session.caps_cache
    if caps is None:  # a pydantic dump per call cost more than the rest of this function
        caps = session.caps_cache = session.spec.budgets.model_dump(exclude_none=True)
    return {
        "agent_calls": c.agent_calls,
        "calls": c.calls,
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "tool_calls": c.tool_calls,
        "elapsed_s": round(time.time() - session.created_at, 3),
        **caps,
        "stop": session.stop_reason,
    }
