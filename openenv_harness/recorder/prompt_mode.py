"""How the forward step asks the engine for a sample: the session's prompt mode, as one strategy.

- ``full_history`` (default): the agent's messages go to ``/v1/chat/completions`` as they are; the
  engine re-renders the whole history each turn and replay drift is detected afterwards.
- ``incremental``: an agent call that continues its chain is sampled from the exact checkpoint
  C = previous prompt ids + previous sampled ids, then the junction trailer (the ids the template
  puts after the end-of-turn id, from the template certification), then the engine's own rendering
  of only the new messages. Exact by construction: replay-only drift cannot happen. Tokenizer-free:
  every id comes from the engine (``/v1/chat/completions/render``, ``/inference/v1/generate`` or
  ``/v1/completions`` with an id prompt -- ``id_sampling.py`` --, and the engine's parsers, which turn
  the sampled ids into the chat reply: in generate's own reply where the engine has that (vLLM 0.33),
  else through ``/v1/chat/completions/derender`` -- ``sample_parse.py``).

A call continues only when everything is certain (``history_match`` for the replayed history, the
certified junction, a suffix whose rendering on a probe prefix -- ending in an assistant tool call
with the real tool name, rendered without the tool list where the engine allows (``probe_prefix``) --
is also the tail of the engine's full render of the same messages, right after a turn end there).
Otherwise it falls back to full history with the reason recorded (``strict`` rejects instead,
except for a genuine history change, which starts a new chain as in full history). A spliced
prompt that was not certified is never sent.

What the model sees differs from a full render where the agent re-spelled the history (that is
the point) or where the template drops earlier content (e.g. old reasoning): the records say where
and by how much (``full_render_diff``); the exact checkpoint is kept, so samples stay exact.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from itertools import compress, count
from operator import ne
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from openenv_harness.recorder import history_match
from openenv_harness.recorder.id_sampling import COMPLETIONS, NotExpressible, completion_body, sampler_for
from openenv_harness.recorder.probe_prefix import probe_prefixes
from openenv_harness.recorder.sample_parse import sample_and_parse
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.upstream.base import Upstream, UpstreamReply

if TYPE_CHECKING:
    from openenv_harness.recorder.flow import Flow

RENDER = "/v1/chat/completions/render"
MAX_CHECKPOINTS = 8
MAX_MEMO_MESSAGES = 1024
#: reasons that are not uncertainty: a strict session still proceeds (a new chain, as in full history)
NEW_CHAIN = {"chain_start", "history_changed", "aux_call"}
_PROBE_USER = {"role": "user", "content": "."}


@dataclass
class Checkpoint:
    """One chain tip: the exact ids the engine has seen and said, and the messages they stand for."""

    ids: list[int]
    message_digests: list[str]
    reply: dict[str, Any]
    reply_digest: str
    rendering: str
    ends_turn: bool


@dataclass
class _Call:
    """What a call in flight worked out that its commit reuses (``Flow.prompt_mode_call``): its
    history's digests and tools digest (``_find_parent``), and, once it continued, the checkpoint it
    continued (replaced by the call's own once it is recorded: call numbers are given only then) and
    its prompt."""

    digests: list[str]
    rendering: str
    parent: Checkpoint | None = None
    prompt: list[int] | None = None


@dataclass
class IncrementalState:
    """Per session: recent chain tips (sub-agents interleave) and whether the engine lacks the routes."""

    checkpoints: list[Checkpoint] = field(default_factory=list)
    routes_missing: str | None = None
    #: message (its JSON) -> its canonical digest: a call replays the previous call's messages, so
    #: only the new ones are canonicalized (a pure function's memo; bounded)
    digest_memo: dict[bytes, str] = field(default_factory=dict)

    def digests(self, messages: list[Any]) -> list[str]:
        out = []
        memo = self.digest_memo
        for message in messages:
            key = orjson.dumps(message)
            found = memo.get(key)
            if found is None:
                found = memo[key] = history_match.digest(message)
            out.append(found)
        while len(memo) > 4 * MAX_MEMO_MESSAGES:  # oldest first (dicts keep insertion order)
            del memo[next(iter(memo))]
        return out


class Fallback(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class FullHistory:
    """Today's behaviour: the agent's messages, rendered in full by the engine."""

    name = "full_history"

    async def send(self, flow: "Flow", upstream: Upstream) -> UpstreamReply:
        return await upstream.chat(flow.upstream_body, session_id=flow.session.id, affinity=flow.session.affinity_key)

    def committed(self, flow: "Flow") -> None:
        return None


class Incremental:
    name = "incremental"

    async def send(self, flow: "Flow", upstream: Upstream) -> UpstreamReply:
        state = _state(flow)
        started = time.perf_counter()
        try:
            reply = await self._continue(flow, upstream, state)
        except Fallback as fb:
            if flow.session.spec.prompt_mode_strict and fb.reason not in NEW_CHAIN:
                raise AgentError(409, f"incremental continuation is not certain ({fb.reason}): {fb.detail}",
                                 type="invalid_request_error", code="prompt_mode_uncertain") from None
            flow.prompt_mode = {"mode": self.name, "continued": False, "reason": fb.reason, "detail": fb.detail}
            return await upstream.chat(flow.upstream_body, session_id=flow.session.id,
                                       affinity=flow.session.affinity_key)
        reply.elapsed_ms = (time.perf_counter() - started) * 1000.0
        return reply

    def committed(self, flow: "Flow") -> None:
        """After the record is durable: this call's ids become its chain's checkpoint."""
        ev = flow.evidence
        if flow.call_kind != "agent" or ev is None or not ev.valid or flow.agent_reply is None:
            return
        choices = flow.agent_reply.get("choices") or [{}]
        message = choices[0].get("message") or {}
        completion = list(ev.completion_ids or [])
        state = _state(flow)
        call = flow.prompt_mode_call
        if not isinstance(call, _Call):  # not worked out while in flight (a chain's start, an engine without the routes)
            call = _Call(state.digests(flow.body.get("messages") or []), history_match.tools_digest(flow.body))
        # a continued call's prompt is the list it composed (the evidence holds the same ids as an array)
        prompt = call.prompt if call.prompt is not None else list(ev.prompt_ids or [])
        turn_end = _turn_end_ids(flow)
        checkpoint = Checkpoint(ids=prompt + completion, message_digests=call.digests, reply=message,
                                reply_digest=history_match.digest(message), rendering=call.rendering,
                                ends_turn=bool(turn_end) and bool(completion) and completion[-1] == turn_end[0])
        parent = call.parent
        # by identity: calls of other chains may have committed meanwhile
        state.checkpoints = [c for c in state.checkpoints if c is not parent][-(MAX_CHECKPOINTS - 1):]
        state.checkpoints.append(checkpoint)

    # -- the continuation ------------------------------------------------------------------------

    async def _continue(self, flow: "Flow", upstream: Upstream, state: IncrementalState) -> UpstreamReply:
        if flow.call_kind != "agent":
            raise Fallback("aux_call", f"a {flow.call_kind} call is not part of a chain")
        messages = flow.body.get("messages") or []
        checkpoint = _find_parent(flow, state, messages)
        if not upstream.exact_ids:
            raise Fallback("no_scale_out_routes", f"{upstream.name} takes messages, not prompt ids (a white-box "
                           "ModelStep): nothing can be continued exactly")
        turn_end = _turn_end_ids(flow)
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
        session = flow.session.id
        # the full render (for the sampling parameters and the contrast) and the suffix's renders are
        # independent: one round trip's latency instead of two. The full render is asked first: the
        # engine answers it first, and its long reply is read here while the engine renders the suffix
        has_tools = bool(flow.upstream_body.get("tools") or flow.upstream_body.get("tool_choice"))
        with_tools = has_tools and probe_prefixes.needs_tools(upstream)
        full, rendered_suffix, sampler = await asyncio.gather(
            _render(upstream, state, flow.upstream_body, session, flow.session.affinity_key),
            _suffix_ids(flow, upstream, state, checkpoint, suffix, turn_end, with_tools=with_tools),
            sampler_for(upstream), return_exceptions=True)
        for outcome in (full, rendered_suffix, sampler):
            if isinstance(outcome, BaseException):
                raise outcome
        assert isinstance(full, dict) and isinstance(rendered_suffix, tuple) and not isinstance(sampler, BaseException)
        suffix_ids, rerendered = rendered_suffix
        full_ids = full["token_ids"]  # checked ids (``_render``)
        sure = certified(full_ids, suffix_ids, turn_end)
        if not sure and has_tools and not with_tools:
            # rendered without the tool list (``probe_prefix``): this template may need it; once more with it
            with_tools = True
            suffix_ids, rerendered = await _suffix_ids(flow, upstream, state, checkpoint, suffix, turn_end,
                                                       with_tools=True)
            sure = certified(full_ids, suffix_ids, turn_end)
            if sure:
                probe_prefixes.learn_needs_tools(upstream)
        if not sure:
            raise Fallback("suffix_not_certified", "the new messages render differently after the real history "
                           "than after the probe prefix")
        prompt = checkpoint.ids + turn_end[1:] + suffix_ids
        params = dict(full.get("sampling_params") or {})
        if not (flow.body.get("max_tokens") or flow.body.get("max_completion_tokens")) and "max_tokens" in params:
            params["max_tokens"] = max(1, int(params["max_tokens"]) - max(0, len(prompt) - len(full_ids)))
        if sampler.route == COMPLETIONS:
            try:
                completion_body(prompt, params, None)
            except NotExpressible as exc:
                raise Fallback("sampling_not_expressible", str(exc)) from None
        meta = flow.prompt_mode = {
            "mode": self.name, "continued": True, "reason": None, "sampled_via": sampler.route,
            "checkpoint_len": len(checkpoint.ids), "trailer_len": len(turn_end) - 1, "suffix_len": len(suffix_ids),
            # the template re-renders an assistant turn once messages follow it: the model continues the
            # turn as it was sampled, which the full render above shows differently (README: prompt mode)
            "template_rerenders_turn": rerendered,
            "probe_rendered_tools": with_tools,  # the probe's tool list, only where the template needs it
        }
        reply = await sample_and_parse(upstream, sampler, prompt, params, full, flow.upstream_body, meta,
                                       model=flow.upstream_body.get("model"), session_id=session,
                                       affinity=flow.session.affinity_key)
        meta["equivalences"] = history_match.used_equivalences(messages[cut - 1], checkpoint.reply)
        prompt_array = array("I", prompt)
        meta["full_render_diff"] = render_diff(prompt_array, full["token_array"])
        if reply.status != 200:
            return reply  # an engine error mid-way: relayed and recorded by the forward step
        call = flow.prompt_mode_call
        assert isinstance(call, _Call)  # set by _find_parent
        call.parent, call.prompt = checkpoint, prompt  # the commit replaces the parent by this call's own
        # the prompt's ids are already checked ints (the checkpoint's, the certified trailer's, the
        # suffix's): the evidence takes them as they are, as from a transport that read them (flow.py)
        flow.prompt_ids = prompt_array
        return reply


def _state(flow: "Flow") -> IncrementalState:
    if flow.session.prompt_mode_state is None:
        flow.session.prompt_mode_state = IncrementalState()
    return flow.session.prompt_mode_state


def _turn_end_ids(flow: "Flow") -> list[int]:
    """The certified turn ending (end-of-turn id, then the trailer), or nothing."""
    watch = flow.ctx.engine_watch
    cert = getattr(watch, "certification", None)
    if cert is None or not cert.turn_end_ids:
        return []
    junction = next((p for p in cert.properties if p.name == "junction"), None)
    return list(cert.turn_end_ids) if junction is not None and junction.passed else []


def _find_parent(flow: "Flow", state: IncrementalState, messages: list[Any]) -> Checkpoint:
    """The most recent chain tip whose history this call replays (named equivalences allowed)."""
    if not state.checkpoints:
        raise Fallback("chain_start", "no earlier sample in this session to continue")
    digests = state.digests(messages)
    rendering = history_match.tools_digest(flow.body)
    flow.prompt_mode_call = _Call(digests, rendering)  # the call's commit reuses them
    for index in range(len(state.checkpoints) - 1, -1, -1):
        c = state.checkpoints[index]
        n = len(c.message_digests)
        if (c.rendering == rendering and len(digests) > n and digests[:n] == c.message_digests
                and digests[n] == c.reply_digest):
            return c
    raise Fallback("history_changed", "the history up to the previous assistant turn is not what was sampled "
                   "(an edited, dropped or inserted message, changed tools, or a new conversation)")


async def _render(upstream: Upstream, state: IncrementalState, body: dict[str, Any], session: str,
                  affinity: str | None) -> dict[str, Any]:
    reply = await upstream.post_for_session(RENDER, {k: v for k, v in body.items() if k != "stream"},
                                            session_id=session, affinity=affinity)
    if reply.status in (403, 404, 405):
        state.routes_missing = (f"the engine has no {RENDER} (HTTP {reply.status}): start vLLM with --enable-scale-out "
                                "(behind a router: one that forwards the render, generate and derender routes)")
        raise Fallback("no_scale_out_routes", state.routes_missing)
    ids = (reply.json or {}).get("token_ids")
    if reply.status != 200 or not isinstance(ids, list):
        raise Fallback("render_failed", f"{RENDER} answered HTTP {reply.status}: {reply.body[:200]!r}")
    rendered = dict(reply.json or {})
    # checked as it arrives, while the other render is made; the array serves the contrast (``render_diff``)
    rendered["token_array"] = _id_array(ids, RENDER)
    rendered["token_ids"] = rendered["token_array"].tolist()
    return rendered


async def _suffix_ids(flow: "Flow", upstream: Upstream, state: IncrementalState, checkpoint: Checkpoint,
                      suffix: list[Any], turn_end: list[int], *, with_tools: bool) -> tuple[list[int], bool]:
    """The new messages' ids: rendered after a probe prefix ending like the real one, prefix cut off;
    and whether the template re-rendered the probe's assistant turn (``probe_cut``). The tool list is
    rendered only ``with_tools`` (``probe_prefix``: it lands in the part cut off)."""
    calls = checkpoint.reply.get("tool_calls") or []
    name = ((calls[0].get("function") or {}).get("name") if calls and isinstance(calls[0], dict) else None)
    assistant: dict[str, Any] = {"role": "assistant", "content": "" if name else "."}
    if name:
        assistant["tool_calls"] = [{"id": "call_probe", "type": "function",
                                    "function": {"name": name, "arguments": "{}"}}]
    kept = ("model", "tools", "chat_template_kwargs", "tool_choice") if with_tools else ("model", "chat_template_kwargs")
    base = {k: v for k, v in flow.upstream_body.items() if k in kept}
    session = flow.session.id
    probe = {**base, "messages": [_PROBE_USER, assistant], "add_generation_prompt": False}
    prefix = probe_prefixes.get(upstream, probe, turn_end)
    if prefix is None:
        rendered = await _render(upstream, state, probe, session, flow.session.affinity_key)
        prefix = rendered["token_ids"]
        if prefix[-len(turn_end):] != turn_end:
            raise Fallback("junction_uncertified", "the probe's assistant turn does not end with the certified "
                           "turn-end ids")
        probe_prefixes.put(upstream, probe, turn_end, prefix)
    generation = flow.body.get("add_generation_prompt", True)
    whole = await _render(upstream, state, {**base, "messages": [_PROBE_USER, assistant, *suffix],
                                            "add_generation_prompt": generation}, session, flow.session.affinity_key)
    ids = whole["token_ids"]
    cut = probe_cut(prefix, ids, turn_end)
    if cut is None:
        raise Fallback("suffix_not_certified", "the probe prefix is not kept when the new messages follow it, "
                       "and its assistant turn's end cannot be found in the render")
    return ids[cut:], cut != len(prefix)


def _id_array(values: Any, route: str) -> array:
    """An engine's list of token ids as uint32s (JSON booleans read as 0/1, as ``int`` reads them),
    checked in C: anything that is not an id in [0, 2**32) falls back instead of reaching the
    engine's sampler."""
    try:
        return array("I", values)
    except (TypeError, OverflowError, ValueError):
        raise Fallback("render_failed", f"{route} answered token ids that are not all ids") from None


def probe_cut(prefix: list[int], whole: list[int], turn_end: list[int]) -> int | None:
    """Where the new messages start in the probe's render: after the probe prefix, or -- where the
    template renders the probe's assistant turn differently once messages follow it (Qwen3 drops an
    empty think block then) -- after that turn's end, the same turn-end ids in the same turn count.
    The suffix is then still certified against the engine's full render (``_continue``)."""
    if whole[:len(prefix)] == prefix:
        return len(prefix)
    k = len(turn_end)
    start = next(compress(count(), map(ne, prefix, whole)), min(len(prefix), len(whole)))
    cut = next((i + k for i in range(start, len(whole) - k + 1) if whole[i:i + k] == turn_end), None)
    if cut is None or _occurrences(whole[:cut], turn_end) != _occurrences(prefix, turn_end):
        return None
    return cut


def _occurrences(ids: list[int], pattern: list[int]) -> int:
    k, i, found = len(pattern), 0, 0
    while i <= len(ids) - k:
        if ids[i:i + k] == pattern:
            found, i = found + 1, i + k
        else:
            i += 1
    return found


def certified(full: list[int], suffix: list[int], turn_end: list[int]) -> bool:
    """Whether the suffix is the tail of the engine's full render of the same messages, and follows a
    turn end there, as it will follow the checkpoint's end and the certified trailer: a suffix that
    began mid-turn in the full render would be a shorter tail than the new messages' rendering."""
    start = len(full) - len(suffix)
    return (bool(suffix) and start >= len(turn_end) and full[start:] == suffix
            and full[start - len(turn_end):start] == turn_end)


def render_diff(sampled: array, full: array) -> dict[str, Any]:
    """Where the prompt the engine sampled from departs from its own full render of the same messages.
    On the ids' buffers (uint32 arrays, read in place): comparing them id by id as Python ints cost
    ~0.2 ms a call at 5,000 ids and 2 ms at 64,000."""
    if sampled == full:
        return {"identical": True, "position": None, "sampled_len": len(sampled), "full_len": len(full)}
    n = min(len(sampled), len(full))
    a, b = np.frombuffer(sampled, dtype=np.uint32), np.frombuffer(full, dtype=np.uint32)
    head = np.flatnonzero(a[:n] != b[:n])  # first differing position from each end
    start = int(head[0]) if len(head) else n
    back = np.flatnonzero(a[len(a) - n:][::-1] != b[len(b) - n:][::-1])
    tail = min(int(back[0]) if len(back) else n, n - start)
    return {"identical": False, "position": start, "sampled_span": len(sampled) - start - tail,
            "full_span": len(full) - start - tail, "sampled_len": len(sampled), "full_len": len(full)}


def strategy_for(mode: str) -> FullHistory | Incremental:
    return _INCREMENTAL if mode == "incremental" else _FULL


_FULL, _INCREMENTAL = FullHistory(), Incremental()
