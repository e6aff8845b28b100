"""Step: ask the engine for the call's sample, through the weight fence and the session's prompt mode.

What the recorder adds to the agent's body is the capture fields and nothing else (D3); what the
session's prompt mode makes of it is the mode's (``prompt_modes/``). A call the engine was asked
and that got no usable answer -- a transport failure, an engine error, a close cancelling it -- is
raised as an ``AgentError`` marked ``engine_failure``: the pipeline records it as failed before the
agent hears of it.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any

from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.engine_paused import send_through_pause
from openenv_harness.recorder.errors import AgentError, session_closed
from openenv_harness.recorder.prompt_modes.base import ModeCall
from openenv_harness.recorder.prompt_modes.registry import mode_for
from openenv_harness.recorder.relay_errors import relay_upstream_error, relay_upstream_failure
from openenv_harness.recorder.sampling_policy import apply_policy
from openenv_harness.recorder.upstream.base import UpstreamFailure

if TYPE_CHECKING:
    from openenv_harness.recorder.prompt_modes.engine_facts import EngineFacts

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
        raise session_closed(flow.session)
    mode = mode_for(flow.session.spec.prompt_mode)
    flow.mode_call = call = mode_call(flow, ctx.engine_facts.of(upstream) if mode.uses_engine_facts else None)
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
    flow.prompt_ids = sampled.prompt_ids if sampled.prompt_ids is not None else read_prompt_ids(flow)
    if reply.status != 200 or reply.json is None:
        error = relay_upstream_error(reply)
        error.engine_failure = True
        raise error


def mode_call(flow: Flow, facts: EngineFacts | None) -> ModeCall:
    """What the session's prompt mode is given of this call: the request, its state and, with ``facts``,
    what is known of the engine (its learned facts, the certified turn end)."""
    session = flow.session
    cert = flow.ctx.engine_watch.certification if facts is not None else None
    return ModeCall(body=flow.body, upstream_body=flow.upstream_body, call_kind=flow.call_kind,
                    session_id=session.id, affinity=session.affinity_key, strict=session.spec.prompt_mode_strict,
                    state=session.prompt_mode_state, facts=facts,
                    turn_end=cert.certified_turn_end if cert is not None else [])


def read_prompt_ids(flow: Flow) -> array[int] | None:
    """The reply's prompt ids, through the session's reader (which parses only what the previous
    prompt did not already hold; ``PromptIdsReader.take``)."""
    assert flow.reply is not None
    if flow.reply.prompt_span is None:
        return None
    return flow.session.prompt_reader.take(flow.reply)
