"""The engine's sample: asked through the weight fence and the session's prompt mode, checked, capped.

    forward → validate → apply_tool_caps

- ``forward``: what the recorder adds to the agent's body is the capture fields and nothing else (D3);
  what the session's prompt mode makes of it is the mode's (``prompt_modes/``). A call the engine was
  asked and that got no usable answer -- a transport failure, an engine error, a close cancelling it
  -- is raised as an ``AgentError`` marked ``engine_failure``: the pipeline records it as failed
  before the agent hears of it.
- ``validate``: the engine's reply becomes token evidence (``recorder/validate.py`` says what makes it
  valid). A sample the engine aborted part-way (a pause in abort mode, or the engine's own abort) ends
  the call here: handed over, a cut-off reply would become the agent's next history -- a turn the
  policy never finished. The agent is told to retry the whole call (a retryable 503); the funnel
  records the partial sample first (untrainable), and a retry is not answered from it.
- ``apply_tool_caps``: the session's tool-call caps, on the reply, before the agent sees it
  (``session/budget.py`` says what each cap does). The record keeps the policy's sample untouched;
  the agent gets the calls that fit, and ``metadata.tool_limit`` names the cap and what was dropped.
"""

from __future__ import annotations

from typing import Any

from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.call.pending import ENGINE_ABORTED
from openenv_harness.recorder.engine_paused import send_through_pause
from openenv_harness.recorder.errors import AgentError, session_closed
from openenv_harness.recorder.prompt_modes.base import ModeCall
from openenv_harness.recorder.relay_errors import relay_upstream_error, relay_upstream_failure
from openenv_harness.recorder.sampling_policy import apply_policy
from openenv_harness.recorder.upstream.base import UpstreamFailure
from openenv_harness.recorder.validate import extract_evidence

#: What the recorder adds to every upstream body -- and nothing else (D3). ``return_weight_versions``: from
#: vLLM 0.33 the chat route answers which weights sampled which tokens (spans per choice, recorded as
#: ``metadata.weight_versions``); 0.32 ignores the field, as it ignores every field it does not know.
CAPTURE_FIELDS = {"return_token_ids": True, "logprobs": True, "stream": False, "return_weight_versions": True}


def upstream_body(body: dict[str, Any], sampling: dict[str, Any] | None = None,
                  policy_temperature: float | None = None) -> dict[str, Any]:
    """The agent's body verbatim plus the capture fields (``top_logprobs`` only if absent).

    ``sampling`` is what the trainer pinned for the session (applied over the agent's fields);
    ``policy_temperature``, the session's training sampling policy (``sampling_policy.py``), sets the
    whole distribution last.
    """
    out = {k: v for k, v in body.items() if k != "stream_options"}
    if policy_temperature is not None:
        apply_policy(out, body, policy_temperature)
    if sampling:
        out.update(sampling)
        if "tool_choice" in sampling and not body.get("tools"):
            # a pinned tool choice applies to calls that offer tools; on one without (a title, a
            # summary) the engine would refuse the call instead
            if "tool_choice" in body:
                out["tool_choice"] = body["tool_choice"]
            else:
                del out["tool_choice"]
    out.update(CAPTURE_FIELDS)
    out.setdefault("top_logprobs", 0)
    if out.get("top_logprobs") is None:
        out["top_logprobs"] = 0
    return out


async def forward(flow: Flow) -> None:
    ctx = flow.ctx
    upstream = ctx.upstream_for(flow.session.spec.upstream)
    if upstream is None:
        raise AgentError(503, "no engine is configured for this session", type="server_error", code="no_engine",
                         headers={"retry-after": str(ctx.config.retry_after_s)})
    if ctx.store.failure() is not None:  # its record could not be stored: no sample, no call number spent
        ctx.metrics.errors.labels("store_unavailable").inc()
        raise AgentError(503, "the recorder cannot store calls right now; retry shortly", type="server_error",
                         code="store_unavailable", headers={"retry-after": str(ctx.config.retry_after_s)})
    if not await ctx.fence.admit():
        ctx.metrics.rejected.labels("paused").inc()
        raise AgentError(503, "engine is paused for a weight update; retry shortly", type="server_error",
                         code="engine_paused", headers={"retry-after": str(ctx.config.retry_after_s)})
    policy = flow.session.spec.training_sampling
    flow.upstream_body = upstream_body(flow.body, flow.session.spec.sampling,
                                       policy.temperature if policy is not None else None)
    if ctx.fence.served_model:
        flow.upstream_body["model"] = ctx.fence.served_model
    if flow.session.closing:  # a retry whose twin was cancelled by the close, or a call held at the fence
        raise session_closed(flow.session.id)
    session = flow.session
    mode = session.prompt_mode
    # what the mode is given: the request, its state and -- only for a mode that uses them -- what is
    # known of the engine (its learned facts, the certified turn end)
    facts = ctx.engine_facts.of(upstream) if mode.uses_engine_facts else None
    cert = ctx.engine_watch.certification if facts is not None else None
    flow.mode_call = call = ModeCall(
        body=flow.body, upstream_body=flow.upstream_body, call_kind=flow.call_kind, session_id=session.id,
        affinity=session.spec.affinity_key, strict=session.spec.prompt_mode_strict, state=session.prompt_mode_state,
        facts=facts, turn_end=cert.certified_turn_end if cert is not None else [])
    flow.version_start = ctx.fence.version
    flow.engine_asked = True
    ctx.fence.inflight += 1
    try:
        # an engine paused by someone else refuses new calls (vLLM 0.33+): held, not failed
        sampled = await send_through_pause(lambda: mode.sample(call, upstream), ctx.config.pause_wait_s,
                                                    lambda wait: setattr(flow, "engine_paused", wait))
    except UpstreamFailure as exc:
        error = relay_upstream_failure(exc, ctx.config.retry_after_s)
        error.engine_failure = True
        raise error from None
    finally:
        flow.cancellable = False  # the engine answered (or failed): from here on a close waits
        ctx.fence.inflight -= 1
        flow.version_end = ctx.fence.version
    flow.reply = reply = sampled.reply
    ctx.metrics.upstream_latency.observe(reply.elapsed_ms / 1000.0)
    if sampled.prompt_ids is not None:
        flow.prompt_ids = sampled.prompt_ids
    elif reply.prompt_span is not None:  # the session's reader parses only what its previous prompt did not hold
        flow.prompt_ids = session.prompt_reader.take(reply)
    if reply.status != 200 or reply.json is None:
        error = relay_upstream_error(reply)
        error.engine_failure = True
        raise error


def validate(flow: Flow) -> None:
    assert flow.reply is not None and flow.reply.json is not None
    flow.evidence = ev = extract_evidence(flow.reply.json, flow.prompt_ids)
    ev.reasons.extend(flow.reply.doubts)
    if ev.finish_reason == "abort":
        ev.reasons.append("engine aborted the call (finish_reason=abort): a partial sample, kept for inspection")
        error = AgentError(503, "the engine aborted this call part-way (a weight update or an engine abort); "
                           "retry the call", type="server_error", code=ENGINE_ABORTED,
                           headers={"retry-after": str(flow.ctx.config.retry_after_s)})
        error.engine_failure = True
        raise error


def apply_tool_caps(flow: Flow) -> None:
    """Cut the reply to the session's caps; a ``max_total_tool_calls`` cut also stops the session (``Flow.stop``).

    Rewrites ``flow.reply.json`` (a new top-level dict; the engine's is not mutated) to what the
    agent may receive and sets ``flow.tool_limit``; counts the tool calls handed over either way.
    """
    assert flow.reply is not None and flow.reply.json is not None
    choices = flow.reply.json.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return
    choice = choices[0]
    message = choice.get("message")
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list) or not calls or not isinstance(message, dict):
        return
    allowed, cap = flow.session.ledger.allow_tool_calls(len(calls))
    if cap is None:
        return
    delivered = {k: v for k, v in message.items() if k != "tool_calls"}
    if allowed:
        delivered["tool_calls"] = calls[:allowed]
    cut = {**choice, "message": delivered}
    if not allowed and cut.get("finish_reason") == "tool_calls":
        cut["finish_reason"] = "stop"  # nothing left to run: the agent ends its turn
    flow.reply.json = {**flow.reply.json, "choices": [cut]}
    flow.tool_limit = {"cap": cap, "sampled": len(calls), "delivered": allowed, "dropped": calls[allowed:]}
    flow.ctx.metrics.tool_cuts.labels(cap).inc()
    if cap == "max_total_tool_calls":
        flow.stop = cap
        flow.ctx.metrics.budget_stops.labels(cap).inc()
