"""SGLang as an engine: the recorder's engine protocol spoken to SGLang's own routes.

Why an adapter at the far end and not branches in the steps: the recorder's steps speak one engine
protocol -- vLLM's (``base.py``: a chat reply with top-level ``prompt_token_ids``, ``choices[0].token_ids``
and ``token_id:N`` logprobs; the render / generate / derender routes of incremental mode; ``/pause``
and ``/resume`` for the fence). SGLang (0.5.23) serves the same evidence under other names, so this
``Upstream`` wraps the HTTP transport and maps each request out and each reply back:

- **chat**: SGLang returns ids when asked per field (``return_prompt_token_ids``, ``return_token_ids``,
  ``return_meta_info``) and puts them on the choice (``prompt_token_ids``, ``response_token_ids``); the
  sampled ids with their logprobs are ``meta_info.output_token_logprobs`` (``[logprob, id, text]``), its
  weight-version spans ``meta_info.weight_versions``. The reply is rebuilt in the recorder's shape from
  those, and a reply whose two id lists disagree is not trusted (``doubts``).
- **render**: ``/v1/tokenize`` with ``messages`` and an explicit ``add_generation_prompt`` renders the
  chat template to ids, the engine's own rendering.
- **sampling from ids, parsed** (incremental mode's one-step generate): SGLang's chat route takes the
  prompt as ``input_ids`` and still reads the messages for its stop strings, tool-call constraint and
  parsers, so a continued call is sampled and parsed by the same code, with the same sampling
  defaults, as a full-history call -- nothing is mapped by hand. ``/generate`` (ids in, ids out) serves
  two-step sampling; it has no chat parsing, so derender is not offered and such a call falls back.
- **fence**: ``/pause_generation`` with SGLang's modes (``keep`` → ``retract``: requests in flight go
  back to the queue and finish under the new weights, the cache may be flushed meanwhile; ``abort``
  → ``abort``); SGLang has no draining pause, so ``wait`` waits here for the calls in flight through
  this adapter, then pauses. ``/resume`` is ``/continue_generation``.

``served_by`` names the SGLang route that really served a recorder route, for the records.
"""

from __future__ import annotations

import asyncio
from typing import Any

from openenv_harness.recorder.upstream.base import Upstream, UpstreamFailure, UpstreamReply
from openenv_harness.recorder.upstream.routes import COMPLETIONS, DERENDER, GENERATE, RENDER, TOKENIZE

CHAT = "/v1/chat/completions"
SGL_GENERATE = "/generate"
SGL_TOKENIZE = "/v1/tokenize"
SGL_DETOKENIZE = "/v1/detokenize"
PAUSE, CONTINUE = "/pause_generation", "/continue_generation"
#: the recorder's pause modes in SGLang's words (``wait`` has none: drained here, then ``retract``)
PAUSE_MODES = {"keep": "retract", "abort": "abort", "wait": "retract"}
#: what SGLang's chat route is asked for besides the agent's fields (vLLM's capture fields replaced)
SGLANG_CAPTURE = {"return_prompt_token_ids": True, "return_token_ids": True, "return_meta_info": True,
                  "logprobs": True, "stream": False}
#: the recorder's vLLM capture fields SGLang does not declare (its models would accept them silently)
_VLLM_ONLY = frozenset({"return_weight_versions", "return_tokens_as_token_ids", "include_stop_str_in_output"})
#: what a render request carries to ``/v1/tokenize`` (the rest are sampling fields, not rendering)
_RENDER_KEYS = ("model", "messages", "tools", "tool_choice", "chat_template_kwargs", "reasoning_effort",
                "continue_final_message")
#: SGLang's reply fields that are evidence: moved into the recorder's shape, never shown to an agent
_EVIDENCE = ("prompt_token_ids", "response_token_ids", "meta_info")


class SGLangEngine(Upstream):
    """An SGLang server behind ``inner`` (an HTTP transport to its root URL)."""

    exact_ids = True
    family = "sglang"

    def __init__(self, inner: Upstream) -> None:
        self.inner = inner
        self.name = inner.name
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def start(self) -> None:
        await self.inner.start()

    async def aclose(self) -> None:
        await self.inner.aclose()

    def served_by(self, route: str) -> str:
        return {GENERATE: f"{CHAT} (input_ids)", RENDER: SGL_TOKENIZE, DERENDER: f"{CHAT} (input_ids)"}.get(route, route)

    # -- the calls that sample ------------------------------------------------------------------

    async def chat(self, body: dict[str, Any], *, session_id: str, affinity: str | None = None) -> UpstreamReply:
        return await self._sample(sglang_chat_body(body), session_id, affinity)

    async def _sample(self, body: dict[str, Any], session_id: str, affinity: str | None) -> UpstreamReply:
        self._inflight += 1
        self._idle.clear()
        try:
            reply = await self.inner.post_for_session(CHAT, body, session_id=session_id, affinity=affinity)
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()
        return chat_reply(reply)

    async def post_for_session(self, path: str, body: dict[str, Any], *, session_id: str,
                               affinity: str | None = None) -> UpstreamReply:
        if path == RENDER:
            return render_reply(await self.inner.post_for_session(SGL_TOKENIZE, render_body(body),
                                                                  session_id=session_id, affinity=affinity), body)
        if path == GENERATE:
            context = body.get("parse_context")
            if body.get("output_mode") == "derender" and isinstance(context, dict):
                chat_body = {**sglang_chat_body(context), "input_ids": list(body.get("token_ids") or [])}
                return one_step_reply(await self._sample(chat_body, session_id, affinity))
            return _not_served(GENERATE, "SGLang's /generate answers ids without the chat parsers; only "
                                         "one-step sampling (its chat route with input_ids) is served")
        if path in (DERENDER, COMPLETIONS):
            return _not_served(path, "SGLang parses sampled ids only in its chat route")
        return await self.inner.post_for_session(path, body, session_id=session_id, affinity=affinity)

    # -- control and introspection ----------------------------------------------------------------

    async def request(self, method: str, path: str, *, json: Any = None,
                      params: dict[str, str] | None = None) -> UpstreamReply:
        if path == "/pause":
            return await self._pause((params or {}).get("mode", "keep"))
        if path == "/resume":
            return await self.inner.request("POST", CONTINUE, json={})
        if path == GENERATE:  # the id-sampling probe: the one-step route is there
            return UpstreamReply(status=400, json=None, body=b"sglang: token_ids are required")
        if path == RENDER:
            return render_reply(await self.inner.request("POST", SGL_TOKENIZE, json=render_body(json or {})),
                                json or {})
        if path == TOKENIZE and isinstance(json, dict):
            body = {k: v for k, v in json.items() if k != "return_token_strs"}
            if "messages" in body:
                body.setdefault("add_generation_prompt", True)
            return await self.inner.request("POST", SGL_TOKENIZE, json=body)
        if path == "/detokenize" and isinstance(json, dict):
            reply = await self.inner.request("POST", SGL_DETOKENIZE, json={**json, "skip_special_tokens": False})
            if reply.status == 200 and reply.json is not None:  # vLLM's name for the text
                reply.json = {"prompt": reply.json.get("text")}
            return reply
        if path == "/version" and method == "GET":
            reply = await self.inner.request("GET", "/server_info")
            if reply.status == 200 and reply.json is not None:
                reply.json = {"version": f"sglang-{reply.json.get('version')}"}
            return reply
        if path == CHAT and isinstance(json, dict):
            return await self._sample(sglang_chat_body(json), "probe", None)
        return await self.inner.request(method, path, json=json, params=params)

    async def _pause(self, mode: str) -> UpstreamReply:
        if mode not in PAUSE_MODES:
            return UpstreamReply(status=400, json=None, body=f"unknown pause mode {mode!r}".encode())
        if mode == "wait":  # SGLang has no draining pause: the calls in flight here finish first
            await self._idle.wait()
        return await self.inner.request("POST", PAUSE, json={"mode": PAUSE_MODES[mode]})


def sglang_chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """A chat body as SGLang is asked for it: the agent's fields, SGLang's capture fields in place of
    vLLM's."""
    out = {k: v for k, v in body.items() if k not in _VLLM_ONLY and k != "return_token_ids"}
    out.update(SGLANG_CAPTURE)
    return out


def render_body(body: dict[str, Any]) -> dict[str, Any]:
    """A render request as ``/v1/tokenize`` takes it; the generation prompt is always said (omitted,
    SGLang renders as for a chat completion, whatever the caller asked)."""
    out = {k: body[k] for k in _RENDER_KEYS if body.get(k) is not None}
    out["add_generation_prompt"] = bool(body.get("add_generation_prompt", True))
    out.setdefault("messages", [])
    return out


def render_reply(reply: UpstreamReply, request: dict[str, Any]) -> UpstreamReply:
    """``/v1/tokenize``'s answer in the render route's shape. Its ``parse_context`` is the request
    itself: the one-step sample (SGLang's chat route with ``input_ids``) reads its messages and
    settings. No ``sampling_params``: SGLang's chat route derives them, generation-config defaults
    included, exactly as for a full-history call."""
    tokens = (reply.json or {}).get("tokens") if reply.status == 200 else None
    if not isinstance(tokens, list):
        return reply
    context = {k: v for k, v in request.items() if k not in ("stream", "add_generation_prompt")}
    return UpstreamReply(status=200, json={"token_ids": tokens, "sampling_params": {}, "parse_context": context},
                         headers=reply.headers, elapsed_ms=reply.elapsed_ms)


def chat_reply(reply: UpstreamReply) -> UpstreamReply:
    """SGLang's chat reply in the recorder's shape: ids and logprobs from ``meta_info`` and the
    choice's id lists, SGLang's evidence fields removed from the reply an agent sees."""
    if reply.status != 200 or reply.json is None:
        return reply
    doubts = list(reply.doubts)
    out = dict(reply.json)
    choices = []
    prompt: Any = None
    for index, raw in enumerate(out.get("choices") or []):
        if not isinstance(raw, dict):
            choices.append(raw)
            continue
        choice, ids, meta = dict(raw), raw.get("response_token_ids"), raw.get("meta_info")
        if index == 0:
            prompt = raw.get("prompt_token_ids")
        for key in _EVIDENCE:
            choice.pop(key, None)
        lp = (meta or {}).get("output_token_logprobs") if isinstance(meta, dict) else None
        if isinstance(lp, list):
            pairs = [e for e in lp if isinstance(e, list | tuple) and len(e) >= 2]
            lp_ids = [e[1] for e in pairs]
            if ids is None:
                ids = lp_ids
            elif lp_ids != ids:
                doubts.append("sglang_ids_disagree: meta_info.output_token_logprobs names other ids than "
                              "response_token_ids")
            tops = meta.get("output_top_logprobs") if isinstance(meta, dict) else None
            choice["logprobs"] = {"content": [
                {"token": f"token_id:{e[1]}", "logprob": e[0], "bytes": None,
                 "top_logprobs": _alternatives(tops[i] if isinstance(tops, list) and i < len(tops) else None)}
                for i, e in enumerate(pairs)]}
        elif choice.get("logprobs") is not None:  # text tokens only: the ids come from response_token_ids
            choice["logprobs"] = None
        choice["token_ids"] = ids
        spans = (meta or {}).get("weight_versions") if isinstance(meta, dict) else None
        if isinstance(spans, list):
            choice["weight_versions"] = spans
        choices.append(choice)
    out["choices"] = choices
    out["prompt_token_ids"] = prompt
    out.pop("sglext", None)
    out.pop("metadata", None)
    return UpstreamReply(status=200, json=out, headers=reply.headers, elapsed_ms=reply.elapsed_ms, doubts=doubts,
                         body=b"")


def _alternatives(top: Any) -> list[dict[str, Any]]:
    """One position's ``meta_info.output_top_logprobs`` entry (``[[logprob, id, text], ...]``) as
    ``token_id:N`` alternatives, most likely first as SGLang lists them."""
    if not isinstance(top, list):
        return []
    return [{"token": f"token_id:{e[1]}", "logprob": e[0], "bytes": None}
            for e in top if isinstance(e, list | tuple) and len(e) >= 2]


def one_step_reply(reply: UpstreamReply) -> UpstreamReply:
    """A chat reply sampled from ``input_ids`` as the one-step generate reply incremental mode reads."""
    if reply.status != 200 or reply.json is None:
        return reply
    chat = reply.json
    choice = dict((chat.get("choices") or [{}])[0])
    choice.setdefault("message", {"role": "assistant", "content": ""})
    return UpstreamReply(status=200, json={
        "output_mode": "derender", "request_id": chat.get("id"), "model": chat.get("model"),
        "created": chat.get("created"), "usage": chat.get("usage"), "choices": [choice],
        "prompt_token_ids": chat.get("prompt_token_ids")}, headers=reply.headers, elapsed_ms=reply.elapsed_ms,
        doubts=reply.doubts)


def _not_served(route: str, why: str) -> UpstreamReply:
    return UpstreamReply(status=404, json=None, body=f"{route}: {why}".encode())


class ProbedFamily(Upstream):
    """An engine whose family is read from the engine at start (``engine_family="auto"``): SGLang answers
    ``GET /server_info`` with its version, vLLM has no such route. Until started it speaks vLLM's routes."""

    exact_ids = True

    def __init__(self, inner: Upstream) -> None:
        self.inner = inner
        self.name = inner.name
        self.active: Upstream = inner

    @property
    def family(self) -> str:  # type: ignore[override]
        return self.active.family

    async def start(self) -> None:
        await self.inner.start()
        try:
            reply = await self.inner.request("GET", "/server_info")
        except UpstreamFailure:  # not up yet: vLLM's routes, as without a probe
            return
        if reply.status == 200 and isinstance((reply.json or {}).get("version"), str):
            self.active = SGLangEngine(self.inner)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def served_by(self, route: str) -> str:
        return self.active.served_by(route)

    async def chat(self, body: dict[str, Any], *, session_id: str, affinity: str | None = None) -> UpstreamReply:
        return await self.active.chat(body, session_id=session_id, affinity=affinity)

    async def post_for_session(self, path: str, body: dict[str, Any], *, session_id: str,
                               affinity: str | None = None) -> UpstreamReply:
        return await self.active.post_for_session(path, body, session_id=session_id, affinity=affinity)

    async def request(self, method: str, path: str, *, json: Any = None,
                      params: dict[str, str] | None = None) -> UpstreamReply:
        return await self.active.request(method, path, json=json, params=params)


def engine_for(family: str, transport: Upstream) -> Upstream:
    """The upstream that speaks ``family``'s routes over ``transport``: vllm, sglang, or auto (probed at start)."""
    if family == "sglang":
        return SGLangEngine(transport)
    if family == "auto":
        return ProbedFamily(transport)
    return transport
