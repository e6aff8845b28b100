"""``incremental``: each chain continued from the exact ids the engine saw and sampled.

An agent call that continues its chain is sampled from the exact checkpoint C = previous prompt ids
+ previous sampled ids, then the junction trailer (the ids the template puts after the end-of-turn
id, from the template certification), then the engine's own rendering of only the new messages.
Exact by construction: replay-only drift cannot happen. Tokenizer-free: every id comes from the
engine (``/v1/chat/completions/render``, ``/inference/v1/generate`` or ``/v1/completions`` with an id
prompt -- ``id_sampling.py`` --, and the engine's parsers, which turn the sampled ids into the chat
reply: in generate's own reply where the engine has that (vLLM 0.33), else through
``/v1/chat/completions/derender`` -- ``sample_parse.py``).

A call continues only when everything is certain (``history_match`` for the replayed history, the
certified junction, a suffix whose rendering on a probe prefix -- ending in an assistant tool call
with the real tool name, rendered without the tool list where the engine allows (``engine_facts``)
-- is also the tail of the engine's full render of the same messages, right after a turn end there:
``rendering.certified``). Otherwise it falls back to full history with the reason recorded
(``strict`` rejects instead, except for a genuine history change, which starts a new chain as in
full history). A spliced prompt that was not certified is never sent.

What the model sees differs from a full render where the agent re-spelled the history (that is
the point) or where the template drops earlier content (e.g. old reasoning): the records say where
and by how much (``full_render_diff``); the exact checkpoint is kept, so samples stay exact.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from typing import TYPE_CHECKING, Any

from openenv_harness.recorder import history_match
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.prompt_modes.base import ModeCall, Sampled
from openenv_harness.recorder.prompt_modes.id_sampling import NotExpressible, completion_body, sampler_for
from openenv_harness.recorder.prompt_modes.rendering import certified, render, render_diff, suffix_ids
from openenv_harness.recorder.prompt_modes.sample_parse import sample_and_parse
from openenv_harness.recorder.prompt_modes.state import (
    MAX_CHECKPOINTS,
    NEW_CHAIN,
    Checkpoint,
    ContinuationCall,
    Fallback,
)
from openenv_harness.recorder.upstream.base import Upstream, UpstreamReply
from openenv_harness.recorder.upstream.routes import COMPLETIONS

if TYPE_CHECKING:
    from openenv_harness.recorder.validate import Evidence


class Incremental:
    name = "incremental"
    uses_engine_facts = True

    async def sample(self, call: ModeCall, upstream: Upstream) -> Sampled:
        started = time.perf_counter()
        try:
            reply, prompt = await self._continue(call, upstream)
        except Fallback as fb:
            if call.strict and fb.reason not in NEW_CHAIN:
                raise AgentError(409, f"incremental continuation is not certain ({fb.reason}): {fb.detail}",
                                 type="invalid_request_error", code="prompt_mode_uncertain") from None
            call.report = {"mode": self.name, "continued": False, "reason": fb.reason, "detail": fb.detail}
            return Sampled(await upstream.chat(call.upstream_body, session_id=call.session_id, affinity=call.affinity))
        reply.elapsed_ms = (time.perf_counter() - started) * 1000.0
        return Sampled(reply, prompt)

    def report(self, call: ModeCall | None) -> dict[str, Any] | None:
        reported = call.report if call is not None else None
        return reported or {"mode": self.name, "continued": False, "reason": "not_attempted"}

    def committed(self, call: ModeCall, evidence: Evidence, agent_reply: dict[str, Any]) -> None:
        """After the record is durable: this call's ids become its chain's checkpoint."""
        ev = evidence
        if call.call_kind != "agent" or not ev.valid:
            return
        choices = agent_reply.get("choices") or [{}]
        message = choices[0].get("message") or {}
        completion = list(ev.completion_ids or [])
        state = call.state
        worked_out = call.continuation
        if worked_out is None:  # not worked out while in flight (a chain's start, an engine without the routes)
            worked_out = ContinuationCall(state.digests(call.body.get("messages") or []),
                                          history_match.tools_digest(call.body))
        # a continued call's prompt is the list it composed (the evidence holds the same ids as an array)
        prompt = worked_out.prompt if worked_out.prompt is not None else list(ev.prompt_ids or [])
        turn_end = call.turn_end
        checkpoint = Checkpoint(ids=prompt + completion, message_digests=worked_out.digests, reply=message,
                                reply_digest=history_match.digest(message), rendering=worked_out.rendering,
                                ends_turn=bool(turn_end) and bool(completion) and completion[-1] == turn_end[0])
        parent = worked_out.parent
        # by identity: calls of other chains may have committed meanwhile
        state.checkpoints = [c for c in state.checkpoints if c is not parent][-(MAX_CHECKPOINTS - 1):]
        state.checkpoints.append(checkpoint)

    # -- the continuation ------------------------------------------------------------------------

    async def _continue(self, call: ModeCall, upstream: Upstream) -> tuple[UpstreamReply, array[int] | None]:
        """The continued sample and the prompt it was sampled from (None with an engine error)."""
        if call.call_kind != "agent":
            raise Fallback("aux_call", f"a {call.call_kind} call is not part of a chain")
        state = call.state
        messages = call.body.get("messages") or []
        checkpoint = _find_parent(call, messages)
        if not upstream.exact_ids:
            raise Fallback("no_scale_out_routes", f"{upstream.name} takes messages, not prompt ids (a white-box "
                           "ModelStep): nothing can be continued exactly")
        turn_end = call.turn_end
        if not turn_end:
            raise Fallback("junction_uncertified", "the template certification did not certify the turn-end "
                           "junction (no certification, or the property failed)")
        if not checkpoint.ends_turn:
            raise Fallback("turn_not_ended", "the previous sample did not stop at the end-of-turn id (a length "
                           "stop, or an abort): nothing certified follows it")
        if state.routes_missing:
            raise Fallback("no_scale_out_routes", state.routes_missing)
        cut = len(checkpoint.message_digests) + 1
        suffix = messages[cut:]
        if not suffix:
            raise Fallback("no_new_messages", "nothing follows the previous assistant turn")
        session, affinity = call.session_id, call.affinity
        facts = call.facts
        assert facts is not None  # the mode uses them (``uses_engine_facts``)
        request = call.upstream_body
        generation = bool(call.body.get("add_generation_prompt", True))
        # the full render (for the sampling parameters and the contrast) and the suffix's renders are
        # independent: one round trip's latency instead of two. The full render is asked first: the
        # engine answers it first, and its long reply is read here while the engine renders the suffix
        has_tools = bool(request.get("tools") or request.get("tool_choice"))
        with_tools = has_tools and facts.probe_needs_tools
        full, rendered_suffix, sampler = await asyncio.gather(
            render(upstream, state, request, session, affinity),
            suffix_ids(upstream, facts, state, checkpoint, suffix, turn_end, request, generation=generation,
                       session=session, affinity=affinity, with_tools=with_tools),
            sampler_for(upstream, facts), return_exceptions=True)
        for outcome in (full, rendered_suffix, sampler):
            if isinstance(outcome, BaseException):
                raise outcome
        assert isinstance(full, dict) and isinstance(rendered_suffix, tuple) and not isinstance(sampler, BaseException)
        new_ids, rerendered = rendered_suffix
        full_ids = full["token_ids"]  # checked ids (``rendering.render``)
        sure = certified(full_ids, new_ids, turn_end)
        if not sure and has_tools and not with_tools:
            # rendered without the tool list (``engine_facts``): this template may need it; once more with it
            with_tools = True
            new_ids, rerendered = await suffix_ids(upstream, facts, state, checkpoint, suffix, turn_end, request,
                                                   generation=generation, session=session, affinity=affinity,
                                                   with_tools=True)
            sure = certified(full_ids, new_ids, turn_end)
            if sure:
                facts.probe_needs_tools = True
        if not sure:
            raise Fallback("suffix_not_certified", "the new messages render differently after the real history "
                           "than after the probe prefix")
        prompt = checkpoint.ids + turn_end[1:] + new_ids
        params = dict(full.get("sampling_params") or {})
        if not (call.body.get("max_tokens") or call.body.get("max_completion_tokens")) and "max_tokens" in params:
            params["max_tokens"] = max(1, int(params["max_tokens"]) - max(0, len(prompt) - len(full_ids)))
        if sampler.route == COMPLETIONS:
            try:
                completion_body(prompt, params, None)
            except NotExpressible as exc:
                raise Fallback("sampling_not_expressible", str(exc)) from None
        meta = call.report = {
            "mode": self.name, "continued": True, "reason": None, "sampled_via": upstream.served_by(sampler.route),
            "checkpoint_len": len(checkpoint.ids), "trailer_len": len(turn_end) - 1, "suffix_len": len(new_ids),
            # the template re-renders an assistant turn once messages follow it: the model continues the
            # turn as it was sampled, which the full render above shows differently (README: prompt mode)
            "template_rerenders_turn": rerendered,
            "probe_rendered_tools": with_tools,  # the probe's tool list, only where the template needs it
        }
        reply = await sample_and_parse(upstream, facts, sampler, prompt, params, full, request, meta,
                                       model=request.get("model"), session_id=session, affinity=affinity)
        meta["equivalences"] = history_match.used_equivalences(messages[cut - 1], checkpoint.reply)
        prompt_array = array("I", prompt)
        meta["full_render_diff"] = render_diff(prompt_array, full["token_array"])
        if reply.status != 200:
            return reply, None  # an engine error mid-way: relayed and recorded by the forward step
        worked_out = call.continuation
        assert worked_out is not None  # set by _find_parent
        worked_out.parent, worked_out.prompt = checkpoint, prompt  # the commit replaces the parent by this call's own
        # the prompt's ids are already checked ints (the checkpoint's, the certified trailer's, the
        # suffix's): the evidence takes them as they are, as from a transport that read them
        return reply, prompt_array


def _find_parent(call: ModeCall, messages: list[Any]) -> Checkpoint:
    """The most recent chain tip whose history this call replays (named equivalences allowed)."""
    state = call.state
    if not state.checkpoints:
        raise Fallback("chain_start", "no earlier sample in this session to continue")
    digests = state.digests(messages)
    rendering = history_match.tools_digest(call.body)
    call.continuation = ContinuationCall(digests, rendering)  # the call's commit reuses them
    for index in range(len(state.checkpoints) - 1, -1, -1):
        c = state.checkpoints[index]
        n = len(c.message_digests)
        if (c.rendering == rendering and len(digests) > n and digests[:n] == c.message_digests
                and digests[n] == c.reply_digest):
            return c
    raise Fallback("history_changed", "the history up to the previous assistant turn is not what was sampled "
                   "(an edited, dropped or inserted message, changed tools, or a new conversation)")
