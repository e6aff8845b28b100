"""Template certification: before the first sample, does the served chat template keep chains exact?

The recorder renders nothing, but the engine can: each property below is checked with small fixed
probe conversations the engine renders, and a diverging span is turned back into text with
``/detokenize`` so the report can say *what* differs, not only where. The probes are versioned
(``CERT_VERSION``): a change to them changes what a certificate means.

Which route renders them matters. The chat route validates a request before templating it (vLLM
0.32 renames a replayed ``reasoning_content`` to ``reasoning`` there); ``/tokenize`` has no such
step and drops it. So where the engine serves ``POST /v1/chat/completions/render`` (vLLM's
scale-out route, ``--enable-scale-out``: a chat request's prompt ids exactly as the chat route
renders them) the probes go there; otherwise to ``/tokenize`` (chat form), and the report says
which (``probed_via``) -- a /tokenize certificate can be wrong about fields the chat route rewrites.

Properties (``required`` ones decide ``certified`` / ``failed``):

- ``tool_prefix`` (required): rendering [user, assistant-with-tool-call] is a token prefix of
  rendering [user, assistant-with-tool-call, tool] with the generation prompt. TRL's
  ``is_chat_template_prefix_preserving`` checks this; without it no tool turn can be appended.
- ``assistant_stable`` (required): an assistant turn carrying reasoning -- non-empty and empty,
  under the field name the engine renders -- renders the same when a tool result follows it.
  Checked for both names agents use (``reasoning``, ``reasoning_content``); which of them the engine
  renders at all is reported (vLLM 0.32's chat route renders both -- it renames
  ``reasoning_content`` -- while its ``/tokenize`` drops ``reasoning_content``).
- ``assistant_stable_across_user`` (informational): the same when a new *user* message follows.
  Templates that drop reasoning of turns before the last user message (Qwen3 by design) fail it.
- ``junction``: what the template emits after an assistant turn's end-of-turn token, so a sampled
  turn that ends there can be continued without a missing or doubled token (the incremental prompt
  mode needs it). Reported with the trailer's text; fails only when no common turn ending exists.
- ``tool_args_roundtrip`` (informational): spaced vs compact vs key-reordered tool arguments -- does
  the template re-serialize them (then an agent's own re-serialization does not matter, but the
  model's sampled spacing survives replay only if it matches the template's)?
- ``content_parts`` (informational): a string vs a list of text parts renders the same.

Engines with neither a render route nor a usable ``/tokenize`` get ``uncertified``: visibly, never a
silent pass.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from openenv_harness.recorder.upstream.base import Upstream

CERT_VERSION = 2  # 2: probed through the render route where the engine serves it
Status = Literal["certified", "failed", "uncertified"]
ProbedVia = Literal["render", "tokenize"]
RENDER = "/v1/chat/completions/render"
#: how an engine says it has no render route: vLLM without --enable-scale-out answers 403
_NO_ROUTE = frozenset({403, 404, 405, 501})

_TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
_USER = {"role": "user", "content": "List the files."}
_SYSTEM = {"role": "system", "content": "You are a coding agent."}
_REASONING = "I should list them."


def _call(arguments: str = '{"command": "ls"}', call_id: str = "call_cert_1") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": arguments}}


def _assistant(content: str = "", *, arguments: str = '{"command": "ls"}', **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": [_call(arguments)], **extra}


_TOOL_RESULT = {"role": "tool", "tool_call_id": "call_cert_1", "name": "bash", "content": "a.py\nb.py\n"}


class ProbeError(Exception):
    """The engine could not render a probe (no /tokenize, an error, a template that refuses it)."""


@dataclass
class PropertyResult:
    name: str
    required: bool
    passed: bool | None  # None: could not be checked
    detail: str  # the verdict in plain words: the cause when it failed
    at: int | None = None  # token position where the renderings diverge
    expected: str | None = None  # the span as the shorter rendering has it, decoded
    found: str | None = None  # the span as the longer rendering has it, decoded
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Certification:
    status: Status
    version: int
    properties: list[PropertyResult]
    probed_at: float
    engine_version: str | None = None
    model: str | None = None
    reason: str | None = None  # why uncertified
    #: ids the template uses to open a tool call (the first ids of a rendered tool call), and the
    #: trailer after an assistant turn's end-of-turn id: what drift causes and junctions need
    tool_call_open_ids: list[int] = field(default_factory=list)
    turn_end_ids: list[int] = field(default_factory=list)
    #: the route the probes were rendered by: ``render`` is the chat route's own rendering
    probed_via: ProbedVia | None = None
    #: why the render route was not used (its HTTP status), when /tokenize was
    render_unavailable: str | None = None

    @property
    def failed(self) -> list[PropertyResult]:
        return [p for p in self.properties if p.required and p.passed is False]

    def summary(self) -> dict[str, Any]:
        """What sessions, health and metrics carry: the verdict and each property's pass/fail."""
        return {"status": self.status, "version": self.version, "probed_at": self.probed_at,
                "probed_via": self.probed_via,
                "properties": {p.name: p.passed for p in self.properties},
                "failed": [{"property": p.name, "detail": p.detail} for p in self.failed],
                **({"reason": self.reason} if self.reason else {})}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Renderer:
    """The engine's rendering (its render route, else /tokenize) and /detokenize as small calls.

    The route is chosen on the first probe: a render route that answers is used for every probe of
    this certification; one the engine does not serve (``_NO_ROUTE``) falls back to /tokenize."""

    def __init__(self, upstream: "Upstream", model: str | None) -> None:
        self.upstream, self.model = upstream, model
        self.via: ProbedVia | None = None
        self.render_unavailable: str | None = None

    async def render(self, messages: list[dict[str, Any]], *, generation: bool, tools: bool = True) -> list[int]:
        body: dict[str, Any] = {"messages": messages, "add_generation_prompt": generation}
        if tools:
            body["tools"] = _TOOLS
        if self.model:
            body["model"] = self.model
        if self.via in (None, "render"):
            status, reply = await self._post(RENDER, body)
            if self.via is None and status in _NO_ROUTE:
                self.via, self.render_unavailable = "tokenize", f"{RENDER} answered HTTP {status}"
            else:
                self.via = "render"
                return self._ids(RENDER, status, reply, "token_ids")
        status, reply = await self._post("/tokenize", body)
        return self._ids("/tokenize", status, reply, "tokens")

    async def _post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        from openenv_harness.recorder.upstream.base import UpstreamFailure

        try:
            reply = await self.upstream.request("POST", path, json=body)
        except UpstreamFailure as exc:
            raise ProbeError(f"{path} unreachable ({exc.kind})") from None
        return reply.status, reply

    @staticmethod
    def _ids(path: str, status: int, reply: Any, key: str) -> list[int]:
        tokens = (reply.json or {}).get(key)
        if status != 200 or not isinstance(tokens, list):
            raise ProbeError(f"{path} answered HTTP {status}: {reply.body[:160]!r}")
        return [int(t) for t in tokens]

    async def text(self, ids: list[int]) -> str:
        from openenv_harness.recorder.upstream.base import UpstreamFailure

        if not ids:
            return ""
        body: dict[str, Any] = {"tokens": ids}
        if self.model:
            body["model"] = self.model
        try:
            reply = await self.upstream.request("POST", "/detokenize", json=body)
        except UpstreamFailure:
            return f"<ids {ids[:12]}>"
        prompt = (reply.json or {}).get("prompt")
        return prompt if reply.status == 200 and isinstance(prompt, str) else f"<ids {ids[:12]}>"


def _prefix_at(short: list[int], long: list[int]) -> int | None:
    """None when ``short`` is a prefix of ``long``, else the first differing position."""
    for i, (a, b) in enumerate(zip(short, long)):
        if a != b:
            return i
    return None if len(short) <= len(long) else len(long)


async def _prefix_property(r: _Renderer, name: str, required: bool, before: list[dict[str, Any]],
                           after: list[dict[str, Any]], ok: str, cause: str, **facts: Any) -> PropertyResult:
    short = await r.render(before, generation=False)
    long = await r.render(after, generation=True)
    at = _prefix_at(short, long)
    if at is None:
        return PropertyResult(name, required, True, ok, facts=dict(facts))
    window = slice(max(0, at - 4), at + 12)
    return PropertyResult(name, required, False, cause, at, await r.text(short[window]), await r.text(long[window]),
                          facts=dict(facts))


async def _reasoning_rendered(r: _Renderer, name: str) -> bool:
    ids = await r.render([_SYSTEM, _USER, _assistant(**{name: _REASONING})], generation=False)
    return _REASONING in await r.text(ids)


async def certify_template(upstream: "Upstream", model: str | None = None, *,
                           engine_version: str | None = None) -> Certification:
    """Probe the served template; ``uncertified`` (with the reason) when the engine cannot render."""
    r = _Renderer(upstream, model)
    now = time.time()
    try:
        props: list[PropertyResult] = []
        props.append(await _prefix_property(
            r, "tool_prefix", True, [_USER, _assistant()], [_USER, _assistant(), _TOOL_RESULT],
            "a tool result appends to the assistant's tool call unchanged",
            "the template renders the assistant's tool-call turn differently once a tool result follows it"))
        rendered = {name: await _reasoning_rendered(r, name) for name in ("reasoning", "reasoning_content")}
        field_name = "reasoning" if rendered["reasoning"] or not rendered["reasoning_content"] else "reasoning_content"
        stable: list[PropertyResult] = []
        for text in (_REASONING, ""):
            a = _assistant("Listing.", **{field_name: text})
            stable.append(await _prefix_property(
                r, "assistant_stable", True, [_SYSTEM, _USER, a], [_SYSTEM, _USER, a, _TOOL_RESULT], "", ""))
        bad = next((p for p in stable if not p.passed), None)
        dropped = [n for n, yes in rendered.items() if not yes]
        where = ("this engine's chat route" if r.via == "render"
                 else "this engine's /tokenize (its chat route may differ)")
        notes = (f"reasoning sent as {', '.join(repr(n) for n in dropped)} is not rendered by {where}"
                 if dropped and len(dropped) < 2 else
                 "this template renders no reasoning field" if dropped else "both reasoning field names are rendered")
        if bad is None:
            props.append(PropertyResult("assistant_stable", True, True,
                                        f"an assistant turn with reasoning renders the same when a tool result "
                                        f"follows; {notes}", facts={"rendered": rendered}))
        else:
            bad.detail = (f"the template re-renders an earlier assistant turn (its reasoning sent as {field_name!r}) "
                          f"once a tool result follows it; {notes}")
            bad.facts = {"rendered": rendered}
            props.append(bad)
        a = _assistant("Listing.", **{field_name: _REASONING})
        props.append(await _prefix_property(
            r, "assistant_stable_across_user", False,
            [_SYSTEM, _USER, a, _TOOL_RESULT, {"role": "assistant", "content": "Done."}],
            [_SYSTEM, _USER, a, _TOOL_RESULT, {"role": "assistant", "content": "Done."},
             {"role": "user", "content": "Again."}],
            "earlier assistant turns render the same after a new user message",
            "the template drops or changes earlier assistant turns (e.g. their reasoning) once a new user message "
            "follows: a chain breaks at every user turn"))
        junction, open_ids, end_ids = await _junction(r)
        props.append(junction)
        props.append(await _args_roundtrip(r))
        props.append(await _content_parts(r))
    except ProbeError as exc:
        return Certification("uncertified", CERT_VERSION, [], now, engine_version, model, reason=str(exc),
                             probed_via=r.via, render_unavailable=r.render_unavailable)
    failed = any(p.required and p.passed is False for p in props)
    return Certification("failed" if failed else "certified", CERT_VERSION, props, now, engine_version, model,
                         tool_call_open_ids=open_ids, turn_end_ids=end_ids, probed_via=r.via,
                         render_unavailable=r.render_unavailable)


async def _junction(r: _Renderer) -> tuple[PropertyResult, list[int], list[int]]:
    """The ids every assistant turn ends with (its end-of-turn id and the trailer after it), and the
    ids a rendered tool call starts with."""
    head = await r.render([_USER], generation=True)
    # two answers with no common last character: what they share at the end is the template's
    one = await r.render([_USER, {"role": "assistant", "content": "Alpha"}], generation=False)
    two = await r.render([_USER, {"role": "assistant", "content": "Beta 7"}], generation=False)
    tail = []
    for a, b in zip(reversed(one), reversed(two)):
        if a != b:
            break
        tail.append(a)
    tail.reverse()
    with_call = await r.render([_USER, _assistant()], generation=False)
    plain = await r.render([_USER, {"role": "assistant", "content": ""}], generation=False)
    start = len(head) if with_call[:len(head)] == head else 0
    diverge = next((i for i, (a, b) in enumerate(zip(with_call[start:], plain[start:])) if a != b), None)
    # the first id where a tool call's rendering departs from an empty answer's: its opening tag
    open_ids = with_call[start + diverge:start + diverge + 1] if diverge is not None else []
    if one[:len(head)] != head:
        at = _prefix_at(head, one) or 0
        return (PropertyResult("junction", True, False,
                               "the generation prompt is not a token prefix of a rendered assistant turn: the "
                               "template's rendering tokenizes the turn's start differently from the prompt the "
                               "model sampled after, so every sampled turn re-renders differently at its start",
                               at, await r.text(head[max(0, at - 4):at + 8]), await r.text(one[max(0, at - 4):at + 8])),
                open_ids, [])
    if not tail:
        return (PropertyResult("junction", True, False, "assistant turns share no common ending: a sampled turn "
                               "cannot be continued safely"), open_ids, [])
    trailer = await r.text(tail[1:])
    return (PropertyResult("junction", True, True,
                           f"an assistant turn ends with {await r.text(tail[:1])!r} then {trailer!r}: a sampled turn "
                           f"that stops at the end-of-turn id is continued after {len(tail) - 1} trailer id(s)",
                           facts={"turn_end_ids": tail, "trailer_text": trailer}), open_ids, tail)


async def _args_roundtrip(r: _Renderer) -> PropertyResult:
    variants = {"spaced": '{"command": "ls", "n": [1, 2]}', "compact": '{"command":"ls","n":[1,2]}',
                "reordered": '{"n": [1, 2], "command": "ls"}'}
    ids = {k: await r.render([_USER, _assistant(arguments=v)], generation=False) for k, v in variants.items()}
    same = {k: ids[k] == ids["spaced"] for k in variants}
    if all(same.values()):
        detail = ("the template re-serializes tool arguments (spaced, compact and reordered render the same): an "
                  "agent's re-serialization cannot drift, but sampled arguments survive replay only in the "
                  "template's own JSON style")
    elif not same["compact"]:
        detail = ("tool arguments render verbatim: an agent that re-serializes the sampled argument text "
                  "(spacing, key order) drifts on replay")
    else:
        detail = ("the template re-serializes tool arguments' spacing (spaced and compact render the same) but keeps "
                  "their key order: an agent that reorders keys drifts, and sampled spacing survives replay only in "
                  "the template's own JSON style")
    return PropertyResult("tool_args_roundtrip", False, all(same.values()), detail, facts={"same_as_spaced": same})


async def _content_parts(r: _Renderer) -> PropertyResult:
    text = await r.render([{"role": "user", "content": "List the files."}], generation=True, tools=False)
    parts = await r.render([{"role": "user", "content": [{"type": "text", "text": "List the files."}]}],
                           generation=True, tools=False)
    ok = text == parts
    return PropertyResult("content_parts", False, ok,
                          "content as a string and as a list of text parts render the same" if ok else
                          "content as a list of parts renders differently from the same text as a string: an agent "
                          "that re-flattens content drifts")
