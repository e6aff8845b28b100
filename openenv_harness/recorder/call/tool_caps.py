"""Step: the session's tool-call caps, on the reply, before the agent sees it (``recorder/session/budget.py``
says what each cap does). The record keeps the policy's sample untouched; the agent gets the calls
that fit, and ``metadata.tool_limit`` names the cap and what was dropped."""

from __future__ import annotations

from openenv_harness.recorder.call.flow import Flow


def apply_tool_caps(flow: Flow) -> None:
    """Cut the reply to the caps; a ``max_total_tool_calls`` cut also stops the session (``Flow.stop``)."""
    if cut_tool_calls(flow) == "max_total_tool_calls":
        flow.stop = "max_total_tool_calls"
        flow.ctx.metrics.budget_stops.labels("max_total_tool_calls").inc()


def cut_tool_calls(flow: Flow) -> str | None:
    """Apply the session's tool-call caps to the reply; the cap that cut it, or None.

    Rewrites ``flow.reply.json`` (a new top-level dict; the engine's is not mutated) to what the
    agent may receive and sets ``flow.tool_limit``; counts the tool calls handed over either way.
    """
    assert flow.reply is not None and flow.reply.json is not None
    choices = flow.reply.json.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    message = choice.get("message")
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list) or not calls or not isinstance(message, dict):
        return None
    allowed, cap = flow.session.ledger.allow_tool_calls(len(calls))
    if cap is None:
        return None
    delivered = {k: v for k, v in message.items() if k != "tool_calls"}
    if allowed:
        delivered["tool_calls"] = calls[:allowed]
    cut = {**choice, "message": delivered}
    if not allowed and cut.get("finish_reason") == "tool_calls":
        cut["finish_reason"] = "stop"  # nothing left to run: the agent ends its turn
    flow.reply.json = {**flow.reply.json, "choices": [cut]}
    flow.tool_limit = {"cap": cap, "sampled": len(calls), "delivered": allowed, "dropped": calls[allowed:]}
    flow.ctx.metrics.tool_cuts.labels(cap).inc()
    return cap
