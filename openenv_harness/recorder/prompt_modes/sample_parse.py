"""How a continued call's sample becomes the chat reply the agent expects: the engine's own parsers,
in one exchange where the engine has it, in two where it has not.

- **One step** (vLLM 0.33): ``/inference/v1/generate`` with ``output_mode="derender"`` and the
  ``parse_context`` the full render answered samples the ids and parses them in the same request:
  the reply carries the parsed message (content, reasoning, tool calls), the finish reason, the
  sampled ids and their logprobs.
- **Two steps** (vLLM 0.32, ``/v1/completions`` id prompts, and any engine whose render answers no
  ``parse_context``): generate answers ids, then ``/v1/chat/completions/derender`` parses them.

Why: a continued call waits on the engine in sequence -- the renders, the sample, the parse -- where
full history waits on one chat call; the parse as its own exchange was a whole round trip on the
critical path (``docs/benchmarks.md``: prompt modes). The one-step parse is vLLM's own parser on the
same ids, so nothing the records hold changes; where the reply could hide the ids
(``include_reasoning: false`` makes vLLM drop them with the logprobs) the call takes two steps.

An engine that answers a one-step request with a 400 naming ``output_mode`` or ``parse_context``
(a render server newer than the generate server behind one router: vLLM's own version-skew rule)
is remembered in the engine's facts (``EngineFacts.two_step_only``) and asked in two steps from then on; that call is sampled again in two
steps, as the refusal sampled nothing. One that samples but answers ids only (the one-step fields
lost on the way, e.g. by a router that re-serializes the body) is remembered the same way, and its
sample is parsed by derender.

A sample of no ids (an abort before the first token: a weight update's pause in abort mode) has
nothing to parse, and vLLM's derender refuses it (400: "choice 0 has empty or null token_ids"): it
becomes an empty assistant message here, with generate's finish reason, so the forward step records
it as every abort (partial, untrainable) and tells the agent to retry, as in full history
(``parsed_via: "nothing_sampled"``).
"""

from __future__ import annotations

from typing import Any

from openenv_harness.recorder.prompt_modes.engine_facts import EngineFacts
from openenv_harness.recorder.prompt_modes.id_sampler import IdSampler
from openenv_harness.recorder.upstream.base import Upstream, UpstreamReply
from openenv_harness.recorder.upstream.routes import DERENDER, GENERATE

#: Prompt ids sent to derender: vLLM reads only the prompt's last few ids there (to seed detokenizing
#: the first sampled token) and takes the prompt's length as ``prompt_tokens``; the whole prompt cost
#: both sides a serialization and a parse of every id (~0.5 MB of JSON at 64k ids).
DERENDER_PROMPT_TAIL = 64


def derender_chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """The chat request derender is given: every field but the history, and of the history only the
    assistant turns that made tool calls.

    Why: derender parses the sampled ids with the engine's tool and reasoning parsers, which read the
    request's settings (tools, tool_choice, include_reasoning, return_token_ids, the chat-template
    kwargs and what builds them) and, of its messages, only how many tool calls the history made
    (vLLM 0.32: a tool-call id scheme numbers new calls after them); nothing else reads them, and
    ``messages`` need only be a list. The whole history cost both sides a serialization and a parse
    (and vLLM a validation of every message) on every continued call."""
    calls = [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "assistant"
             and m.get("tool_calls")]
    out = {k: v for k, v in body.items() if k != "messages"}
    out["messages"] = calls
    return out


def one_step_context(facts: EngineFacts, sampler: IdSampler, render: dict[str, Any],
                     params: dict[str, Any]) -> dict[str, Any] | None:
    """The ``parse_context`` to parse in generate's own reply, or None to parse in a second step."""
    context = render.get("parse_context")
    if (sampler.route != GENERATE or not isinstance(context, dict) or facts.two_step_only
            or context.get("include_reasoning") is False or params.get("detokenize") is False):
        return None
    return context


async def sample_and_parse(upstream: Upstream, facts: EngineFacts, sampler: IdSampler, prompt: list[int], params: dict[str, Any],
                           render: dict[str, Any], chat_body: dict[str, Any], meta: dict[str, Any], *,
                           model: str | None, session_id: str, affinity: str | None) -> UpstreamReply:
    """Sample from ``prompt`` and parse it as the reply to ``chat_body``; ``meta`` (the record's
    prompt-mode metadata) learns how it was parsed (``parsed_via``) or where it failed (``failed_at``).
    A non-200 reply is the engine's, relayed as it is."""
    reply = await _sample_and_parse(upstream, facts, sampler, prompt, params, render, chat_body, meta, model=model,
                                    session_id=session_id, affinity=affinity)
    if reply.status == 200 and reply.json is not None:
        finish_as_chat_route(reply.json, chat_body)
    return reply


def finish_as_chat_route(reply: dict[str, Any], chat_body: dict[str, Any]) -> None:
    """The chat route's finish reason on a parsed reply. Generate and derender report the engine's own
    (``stop``); the chat route says ``tool_calls`` where its parser found calls under ``tool_choice``
    auto (or none given) or ``required`` -- a named tool choice stays ``stop``, as in OpenAI's API --
    so one kind of turn gets one finish reason in both prompt modes. (vLLM 0.33's derender applies the
    same rule itself; 0.32's reports the engine's.)"""
    choice = (reply.get("choices") or [None])[0]
    if not isinstance(choice, dict) or choice.get("finish_reason") != "stop":
        return
    message = choice.get("message")
    if isinstance(message, dict) and message.get("tool_calls") and not isinstance(chat_body.get("tool_choice"), dict):
        choice["finish_reason"] = "tool_calls"


async def _sample_and_parse(upstream: Upstream, facts: EngineFacts, sampler: IdSampler, prompt: list[int], params: dict[str, Any],
                            render: dict[str, Any], chat_body: dict[str, Any], meta: dict[str, Any], *,
                            model: str | None, session_id: str, affinity: str | None) -> UpstreamReply:
    context = one_step_context(facts, sampler, render, params)
    if context is not None:
        generated = await sampler.sample(upstream, prompt, params, model=model, session_id=session_id,
                                         affinity=affinity, output={"output_mode": "derender",
                                                                    "parse_context": context})
        if generated.status == 200 and generated.json is not None and generated.json.get("output_mode") == "derender":
            if _nothing_sampled(generated.json):
                return _empty_reply(generated.json, prompt, meta)
            composed = _compose_one_step(generated.json, prompt)
            meta["parsed_via" if composed.status == 200 else "failed_at"] = upstream.served_by(GENERATE)
            return composed
        if generated.status == 200 and generated.json is not None:
            # sampled, but answered with ids only: something on the way dropped the one-step fields
            # (a router that re-serializes generate's body); the sample stands, derender parses it
            facts.two_step_only = True
        elif _refuses_one_step(generated):
            facts.two_step_only = True
            generated = await sampler.sample(upstream, prompt, params, model=model, session_id=session_id,
                                             affinity=affinity)
        else:
            meta["failed_at"] = upstream.served_by(GENERATE)
            return generated
    else:
        generated = await sampler.sample(upstream, prompt, params, model=model, session_id=session_id,
                                         affinity=affinity)
    if generated.status != 200 or generated.json is None:
        meta["failed_at"] = upstream.served_by(sampler.route)
        return generated  # an engine error mid-way: relayed and recorded by the forward step
    if _nothing_sampled(generated.json):
        return _empty_reply(generated.json, prompt, meta)
    body = {"generate_response": generated.json, "prompt_token_ids": prompt[-DERENDER_PROMPT_TAIL:],
            "prompt_tokens": len(prompt), "chat_request": derender_chat_request(chat_body)}
    derendered = await upstream.post_for_session(DERENDER, body, session_id=session_id, affinity=affinity)
    if derendered.status != 200 or derendered.json is None:
        meta["failed_at"] = DERENDER
        return derendered
    meta["parsed_via"] = DERENDER
    return compose(derendered.json, generated.json, prompt)


def _refuses_one_step(reply: UpstreamReply) -> bool:
    """A 400 about the one-step fields: this engine (or the generate server behind a router) has none."""
    return reply.status in (400, 422) and (b"output_mode" in reply.body or b"parse_context" in reply.body)


def _nothing_sampled(generated: dict[str, Any]) -> bool:
    """Whether generate answered a sample of no ids (``token_ids: []``, not a missing field)."""
    choice = (generated.get("choices") or [None])[0]
    return isinstance(choice, dict) and choice.get("token_ids") == []


def _empty_reply(generated: dict[str, Any], prompt: list[int], meta: dict[str, Any]) -> UpstreamReply:
    """No ids decode to no text and no calls: the reply is made here, the engine is not asked."""
    meta["parsed_via"] = "nothing_sampled"
    choice = {**(generated.get("choices") or [{}])[0], "logprobs": None}  # compose: generate's, for no ids
    return compose(_chat_reply(generated, choice, {"role": "assistant", "content": "", "tool_calls": []}),
                   generated, prompt)


def _compose_one_step(generated: dict[str, Any], prompt: list[int]) -> UpstreamReply:
    """Generate's one-step reply as the chat reply derender answers for the same sample."""
    choice = (generated.get("choices") or [{}])[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("token_ids"), list) \
            or not isinstance(choice.get("message"), dict):
        return UpstreamReply(status=502, json=None, body=b"the engine's one-step generate reply carries no sampled "
                             b"token_ids or no parsed message: the sample cannot be recorded")
    return compose(_chat_reply(generated, choice, choice["message"]), generated, prompt)


def _chat_reply(generated: dict[str, Any], choice: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
    """A chat reply in derender's shape around ``message``, from generate's reply and its choice."""
    return {
        "id": generated.get("request_id"), "object": "chat.completion", "created": generated.get("created"),
        "model": generated.get("model"),
        "choices": [{"index": 0, "message": message, "logprobs": choice.get("logprobs"),
                     "finish_reason": choice.get("finish_reason"), "stop_reason": choice.get("stop_reason"),
                     "token_ids": None, "routed_experts": choice.get("routed_experts")}],
        "service_tier": None, "system_fingerprint": None, "usage": generated.get("usage"),
        "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None,
        "kv_transfer_params": generated.get("kv_transfer_params"), "ec_transfer_params": None, "metrics": None,
    }


def compose(derendered: dict[str, Any], generated: dict[str, Any], prompt: list[int]) -> UpstreamReply:
    """The chat reply the engine's parsers produced, with the exact ids as token evidence."""
    reply = dict(derendered)
    gen_choice = (generated.get("choices") or [{}])[0]
    choice = dict((reply.get("choices") or [{}])[0])
    ids = [int(t) for t in gen_choice.get("token_ids") or []]
    choice["token_ids"] = ids
    if choice.get("logprobs") is None and isinstance(gen_choice.get("logprobs"), dict):
        choice["logprobs"] = {"content": [{"token": f"token_id:{e['token_id']}", "logprob": e["logprob"],
                                           "bytes": None, "top_logprobs": []}
                                          for e in gen_choice["logprobs"].get("content") or []]}
    reply["choices"] = [choice]
    reply["prompt_token_ids"] = prompt
    reply["usage"] = {**(reply.get("usage") or {}), "prompt_tokens": len(prompt), "completion_tokens": len(ids),
                      "total_tokens": len(prompt) + len(ids)}
    if gen_choice.get("weight_versions") is not None:
        choice["weight_versions"] = gen_choice["weight_versions"]
    # no body: a success is read from ``json`` (the raw body only serves relaying an engine's error)
    return UpstreamReply(status=200, json=reply)
