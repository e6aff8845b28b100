"""How an incremental call samples from exact prompt ids: the engine's route for it, as one strategy.

Why two: vLLM with ``--enable-scale-out`` samples ids on ``/inference/v1/generate``; an engine (or
a router in front of it) without that route still samples ids on ``/v1/completions`` with a
``list[int]`` prompt, which every vLLM serves. Both give the sampled ids and their logprobs; the
incremental mode needs them in generate's shape, because that is what ``/v1/chat/completions/derender``
parses into the chat reply. Which route an engine has is probed once per engine (a malformed
generate request: 400 means the route is there, 403/404/405 that it is not) and kept in its
``EngineFacts``.

``/v1/completions`` takes sampling fields by name, not a ``SamplingParams``; the render's parameters
are mapped field by field. A parameter it cannot express would sample differently, so the call
falls back to full history instead (``sampling_not_expressible``) -- never a silently different sample.

On the real vLLM 0.32 the completion reply gives all of it (``prompt_token_ids`` echoed, ``token_ids``,
``token_id:N`` tokens with their logprobs; ``tests/real_engine/test_real_id_prompts.py``) but not
generate's per-token ``weight_versions``: records sampled there carry no ``metadata.weight_versions``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from openenv_harness.recorder.prompt_modes.engine_facts import EngineFacts
from openenv_harness.recorder.prompt_modes.id_sampler import IdSampler
from openenv_harness.recorder.upstream.base import Upstream, UpstreamReply
from openenv_harness.recorder.upstream.routes import COMPLETIONS, GENERATE

#: ``SamplingParams`` fields ``/v1/completions`` takes under the same name and meaning
_SAME_NAME = frozenset({
    "n", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "max_tokens", "min_tokens",
    "repetition_penalty", "presence_penalty", "frequency_penalty", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "include_stop_str_in_output", "logprobs", "prompt_logprobs", "bad_words",
    "logit_bias", "allowed_token_ids", "structured_outputs", "thinking_token_budget", "repetition_detection",
    "logprob_token_ids", "length_penalty",
})
#: engine-internal fields that do not change what is sampled (output batching, cloning, caching)
_INTERNAL = frozenset({"output_kind", "skip_clone", "skip_reading_prefix_cache", "detokenize", "extra_args"})


class NotExpressible(Exception):
    """A sampling parameter the route cannot carry: the call must not be sampled there."""


class GenerateRoute:
    """``/inference/v1/generate``: the render's sampling parameters as they are."""

    route = GENERATE

    async def sample(self, upstream: Upstream, prompt: list[int], params: dict[str, Any], *, model: str | None,
                     session_id: str, affinity: str | None,
                     output: dict[str, Any] | None = None) -> UpstreamReply:
        """``output``: generate's reply-level fields (``output_mode``, ``parse_context``), as they are."""
        body: dict[str, Any] = {"token_ids": prompt, "sampling_params": params, **(output or {})}
        if model:
            body["model"] = model
        return await upstream.post_for_session(GENERATE, body, session_id=session_id, affinity=affinity)


class IdCompletionRoute:
    """``/v1/completions`` with the prompt as ids, asking for the sampled ids back and for tokens
    spelled ``token_id:N`` (so top logprobs name ids, not text); answered in generate's shape."""

    route = COMPLETIONS

    async def sample(self, upstream: Upstream, prompt: list[int], params: dict[str, Any], *, model: str | None,
                     session_id: str, affinity: str | None,
                     output: dict[str, Any] | None = None) -> UpstreamReply:
        if output:  # a completion has no reply levels: its caller parses the ids in a second step
            raise ValueError(f"{COMPLETIONS} cannot carry {sorted(output)}")
        body = completion_body(prompt, params, model)
        reply = await upstream.post_for_session(COMPLETIONS, body, session_id=session_id, affinity=affinity)
        if reply.status != 200 or reply.json is None:
            return reply
        generated = as_generate_response(reply.json)
        if generated is None:
            return UpstreamReply(status=502, json=None, body=b"the engine's /v1/completions reply carries neither "
                                 b"token_ids nor token_id:N tokens: the sampled ids are unknown")
        return UpstreamReply(status=200, json=generated, headers=reply.headers)  # read from json, as generate's


def completion_body(prompt: list[int], params: dict[str, Any], model: str | None) -> dict[str, Any]:
    """The completion request that samples like ``params``; ``NotExpressible`` names what it cannot."""
    unknown = sorted(k for k, v in params.items() if k not in _SAME_NAME and k not in _INTERNAL and v is not None)
    if unknown:
        raise NotExpressible(f"/v1/completions cannot carry the sampling parameters {unknown}")
    body: dict[str, Any] = {k: v for k, v in params.items() if k in _SAME_NAME and v is not None}
    body.update(prompt=prompt, return_token_ids=True, return_tokens_as_token_ids=True, stream=False, echo=False)
    body.setdefault("skip_special_tokens", False)  # as generate: the parsers need the special tokens' text
    if model:
        body["model"] = model
    return body


def _token_id(name: str) -> int | None:
    return int(name[9:]) if name.startswith("token_id:") and name[9:].isdigit() else None


def as_generate_response(completion: dict[str, Any]) -> dict[str, Any] | None:
    """A ``text_completion`` reply as ``/inference/v1/generate`` would have answered; None when the
    sampled ids cannot be read from it."""
    choice = (completion.get("choices") or [{}])[0]
    lp = choice.get("logprobs") if isinstance(choice.get("logprobs"), dict) else None
    names = list((lp or {}).get("tokens") or [])
    ids = choice.get("token_ids")
    if not isinstance(ids, list):
        from_names = [_token_id(n) for n in names]
        if not names or None in from_names:
            return None
        ids = from_names
    ids = [int(t) for t in ids]
    content = None
    if lp is not None:
        values = list(lp.get("token_logprobs") or [])
        tops = list(lp.get("top_logprobs") or [])
        content = []
        for i, (t, value) in enumerate(zip(ids, values, strict=False)):
            top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
            alts = [{"token_id": tid, "logprob": v} for n, v in top.items() if (tid := _token_id(n)) is not None]
            content.append({"token_id": t, "logprob": value, "top_logprobs": alts})
    return {
        "request_id": completion.get("id"), "model": completion.get("model"), "created": completion.get("created"),
        "usage": completion.get("usage"),
        "choices": [{"index": 0, "finish_reason": choice.get("finish_reason"), "stop_reason": choice.get("stop_reason"),
                     "token_ids": ids, "logprobs": {"content": content} if content is not None else None}],
        "prompt_token_ids": choice.get("prompt_token_ids"),
    }


GENERATE_ROUTE, ID_COMPLETION_ROUTE = GenerateRoute(), IdCompletionRoute()


async def _probe(upstream: Upstream) -> IdSampler:
    reply = await upstream.request("POST", GENERATE, json={"token_ids": []})
    return ID_COMPLETION_ROUTE if reply.status in (403, 404, 405) else GENERATE_ROUTE


async def sampler_for(upstream: Upstream, facts: EngineFacts) -> IdSampler:
    """The engine's id-sampling route, probed on first use; a probe that failed is tried again later."""
    task = facts.sampler_probe
    if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
        task = facts.sampler_probe = asyncio.ensure_future(_probe(upstream))
    return await asyncio.shield(task)
