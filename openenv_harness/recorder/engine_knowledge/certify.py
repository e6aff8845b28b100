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
- ``junction`` (required for incremental): the turn's *end* -- what the template emits after an
  assistant turn's end-of-turn token, so a sampled turn that ends there can be continued without a
  missing or doubled token. Reported with the trailer's text; fails only when no common turn ending
  exists. It is all the incremental prompt mode needs: the model's own ids stand for the turn.
- ``turn_start`` (required for full history): the generation prompt is a token prefix of a rendered
  assistant turn. Templates that open a think block in the generation prompt (``<think>\n``, Qwen3.5
  and later, Nemotron 3, GLM-4 MoE) fail it under tokenizers that merge that newline with the next:
  every sampled turn then re-renders differently at its start when the history is replayed, which
  only full history does.
- ``tool_args_roundtrip`` (informational): spaced vs compact vs key-reordered tool arguments -- does
  the template re-serialize them (then an agent's own re-serialization does not matter, but the
  model's sampled spacing survives replay only if it matches the template's)?
- ``content_parts`` (informational): a string vs a list of text parts renders the same.

Each required property names the prompt modes it is needed for (``PropertyResult.modes``); a
certificate says which modes the template is exact in (``exact_in``). ``certified`` means exact in
every mode; ``failed`` names the failed properties, and may still be exact in one mode (a think
template is exact in incremental mode only). A probe the template refuses fails that property only
(``passed`` None, the engine's words in ``detail``): one unrenderable conversation hides nothing else.

Engines with neither a render route nor a usable ``/tokenize`` get ``uncertified``: visibly, never a
silent pass.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from openenv_harness.recorder.upstream.routes import RENDER, TOKENIZE

if TYPE_CHECKING:
    from openenv_harness.recorder.upstream.base import Upstream

CERT_VERSION = 3  # 2: probed through the render route where the engine serves it; 3: turn start and end apart
Status = Literal["certified", "failed", "uncertified"]
PromptMode = Literal["full_history", "incremental"]
PROMPT_MODES: tuple[PromptMode, ...] = ("full_history", "incremental")
#: the prompt modes each required property is needed for: full history replays the whole history
#: through the template; incremental mode renders only the new messages after the model's own ids
NEEDED_BY: dict[str, tuple[PromptMode, ...]] = {
    "tool_prefix": ("full_history",), "assistant_stable": ("full_history",), "turn_start": ("full_history",),
    "junction": ("incremental",)}
ProbedVia = Literal["render", "tokenize"]
#: the properties a certification checks (``PropertyResult.name``)
PropertyName = Literal["tool_prefix", "assistant_stable", "assistant_stable_across_user", "turn_start", "junction",
                       "tool_args_roundtrip", "content_parts"]
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
    """The engine could not render a probe (unreachable, no /tokenize, a server error)."""


class ProbeRefused(ProbeError):
    """The template refused one probe conversation (the engine's 4xx, e.g. "roles must alternate"):
    that probe's property is unchecked, the others stand."""


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

    @property
    def modes(self) -> tuple[PromptMode, ...]:
        """The prompt modes that are not exact without this property (none for an informational one)."""
        return NEEDED_BY.get(self.name, ()) if self.required else ()


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

    def passed(self, name: PropertyName) -> bool:
        """Whether the property ``name`` was checked and held."""
        return any(p.name == name and p.passed is True for p in self.properties)

    @property
    def certified_turn_end(self) -> list[int]:
        """The turn ending a continuation may follow (end-of-turn id, then the trailer) when the
        junction held; nothing otherwise."""
        return list(self.turn_end_ids) if self.turn_end_ids and self.passed("junction") else []

    @property
    def exact_in(self) -> list[PromptMode]:
        """The prompt modes whose every required property passed (a property that could not be
        checked is not a pass)."""
        return [m for m in PROMPT_MODES
                if all(p.passed is True for p in self.properties if m in p.modes)
                and any(m in p.modes for p in self.properties)]

    def summary(self) -> dict[str, Any]:
        """What sessions, health and metrics carry: the verdict, the modes it is exact in and each
        property's pass/fail."""
        return {"status": self.status, "version": self.version, "probed_at": self.probed_at,
                "probed_via": self.probed_via, "exact_in": self.exact_in,
                "properties": {p.name: p.passed for p in self.properties},
                "failed": [{"property": p.name, "detail": p.detail, "modes": list(p.modes)} for p in self.failed],
                "unchecked": [{"property": p.name, "detail": p.detail}
                              for p in self.properties if p.required and p.passed is None],
                **({"reason": self.reason} if self.reason else {})}

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exact_in": self.exact_in}


def exact_in_words(exact_in: Sequence[str] | None) -> str:
    """The modes a template is exact in, as a run summary or the doctor says them."""
    if not exact_in:
        return "exact in no prompt mode"
    if set(exact_in) >= set(PROMPT_MODES):
        return "exact in both prompt modes"
    return "exact in " + " and ".join(m.replace("_", " ") for m in exact_in) + " mode only"


class _Renderer:
    """The engine's rendering (its render route, else /tokenize) and /detokenize as small calls.

    The route is chosen on the first probe: a render route that answers is used for every probe of
    this certification; one the engine does not serve (``_NO_ROUTE``) falls back to /tokenize."""

    def __init__(self, upstream: Upstream, model: str | None) -> None:
        self.upstream, self.model = upstream, model
        self.via: ProbedVia | None = None
        self.render_unavailable: str | None = None
        #: the reasoning field this engine renders (``_reasoning_field``), found once
        self.reasoning_field: tuple[str, dict[str, bool], str] | None = None

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
        status, reply = await self._post(TOKENIZE, body)
        return self._ids(TOKENIZE, status, reply, "tokens")

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
        if status in (400, 422):
            raise ProbeRefused(f"{path} answered HTTP {status}: {_engine_message(reply)}")
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


def _engine_message(reply: Any) -> str:
    """The engine's own words for a refusal (OpenAI error shape), else the body's start."""
    error = (reply.json or {}).get("error") if isinstance(reply.json, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return str(message)[:200] if message else repr(reply.body[:160])


def _prefix_at(short: list[int], long: list[int]) -> int | None:
    """None when ``short`` is a prefix of ``long``, else the first differing position."""
    for i, (a, b) in enumerate(zip(short, long, strict=False)):
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


async def certify_template(upstream: Upstream, model: str | None = None, *,
                           engine_version: str | None = None) -> Certification:
    """Probe the served template; ``uncertified`` (with the reason) when the engine cannot render."""
    r = _Renderer(upstream, model)
    now = time.time()
    ends: dict[str, list[int]] = {"open": [], "end": []}
    try:
        await r.render([_USER], generation=True)  # the route, and whether the engine renders at all
        props = [
            await _checked("tool_prefix", True, _tool_prefix(r)),
            await _checked("assistant_stable", True, _assistant_stable(r)),
            await _checked("assistant_stable_across_user", False, _stable_across_user(r)),
            await _checked("turn_start", True, _turn_start(r)),
            await _checked("junction", True, _junction(r, ends)),
            await _checked("tool_args_roundtrip", False, _args_roundtrip(r)),
            await _checked("content_parts", False, _content_parts(r)),
        ]
    except ProbeError as exc:  # the engine, not one probe: nothing can be said
        return Certification("uncertified", CERT_VERSION, [], now, engine_version, model, reason=str(exc),
                             probed_via=r.via, render_unavailable=r.render_unavailable)
    failed = any(p.required and p.passed is False for p in props)
    unchecked = [p.name for p in props if p.required and p.passed is None]
    status: Status = "failed" if failed else "uncertified" if unchecked else "certified"
    return Certification(status, CERT_VERSION, props, now, engine_version, model,
                         reason=f"the template refused the probes of {', '.join(unchecked)}" if unchecked else None,
                         tool_call_open_ids=ends["open"], turn_end_ids=ends["end"], probed_via=r.via,
                         render_unavailable=r.render_unavailable)


async def _checked(name: str, required: bool, check: Awaitable[PropertyResult]) -> PropertyResult:
    """One property; a probe the template refuses leaves it unchecked, with the engine's words."""
    try:
        return await check
    except ProbeRefused as exc:
        return PropertyResult(name, required, None, f"the template refused this property's probe: {exc}")


async def _tool_prefix(r: _Renderer) -> PropertyResult:
    return await _prefix_property(
        r, "tool_prefix", True, [_USER, _assistant()], [_USER, _assistant(), _TOOL_RESULT],
        "a tool result appends to the assistant's tool call unchanged",
        "the template renders the assistant's tool-call turn differently once a tool result follows it")


async def _reasoning_field(r: _Renderer) -> tuple[str, dict[str, bool], str]:
    """The reasoning field name the engine renders, which names it renders, and that said in words."""
    if r.reasoning_field is not None:
        return r.reasoning_field
    rendered = {name: await _reasoning_rendered(r, name) for name in ("reasoning", "reasoning_content")}
    field_name = "reasoning" if rendered["reasoning"] or not rendered["reasoning_content"] else "reasoning_content"
    dropped = [n for n, yes in rendered.items() if not yes]
    where = ("this engine's chat route" if r.via == "render"
             else "this engine's /tokenize (its chat route may differ)")
    notes = (f"reasoning sent as {', '.join(repr(n) for n in dropped)} is not rendered by {where}"
             if dropped and len(dropped) < 2 else
             "this template renders no reasoning field" if dropped else "both reasoning field names are rendered")
    r.reasoning_field = (field_name, rendered, notes)
    return r.reasoning_field


async def _assistant_stable(r: _Renderer) -> PropertyResult:
    field_name, rendered, notes = await _reasoning_field(r)
    for text in (_REASONING, ""):
        a = _assistant("Listing.", **{field_name: text})
        bad = await _prefix_property(
            r, "assistant_stable", True, [_SYSTEM, _USER, a], [_SYSTEM, _USER, a, _TOOL_RESULT], "", "")
        if not bad.passed:
            bad.detail = (f"the template re-renders an earlier assistant turn (its reasoning sent as "
                          f"{field_name!r}) once a tool result follows it; {notes}")
            bad.facts = {"rendered": rendered}
            return bad
    return PropertyResult("assistant_stable", True, True, f"an assistant turn with reasoning renders the same when "
                          f"a tool result follows; {notes}", facts={"rendered": rendered})


async def _stable_across_user(r: _Renderer) -> PropertyResult:
    field_name, _, _ = await _reasoning_field(r)
    a = _assistant("Listing.", **{field_name: _REASONING})
    return await _prefix_property(
        r, "assistant_stable_across_user", False,
        [_SYSTEM, _USER, a, _TOOL_RESULT, {"role": "assistant", "content": "Done."}],
        [_SYSTEM, _USER, a, _TOOL_RESULT, {"role": "assistant", "content": "Done."},
         {"role": "user", "content": "Again."}],
        "earlier assistant turns render the same after a new user message",
        "the template drops or changes earlier assistant turns (e.g. their reasoning) once a new user message "
        "follows: a chain breaks at every user turn")


async def _turn_start(r: _Renderer) -> PropertyResult:
    """Whether the generation prompt is a token prefix of a rendered assistant turn: replaying a
    sampled turn through the template gives back the prompt the model sampled after."""
    head = await r.render([_USER], generation=True)
    one = await r.render([_USER, {"role": "assistant", "content": "Alpha"}], generation=False)
    if one[:len(head)] == head:
        return PropertyResult("turn_start", True, True, "the generation prompt is a token prefix of a rendered "
                              "assistant turn: a replayed turn starts as the model saw it")
    at = _prefix_at(head, one) or 0
    return PropertyResult("turn_start", True, False,
                          "the generation prompt is not a token prefix of a rendered assistant turn: the template's "
                          "rendering tokenizes the turn's start together with what follows, so every sampled turn "
                          "re-renders differently at its start under full history (incremental mode continues the "
                          "model's own ids and is unaffected)",
                          at, await r.text(head[max(0, at - 4):at + 8]), await r.text(one[max(0, at - 4):at + 8]))


async def _junction(r: _Renderer, ends: dict[str, list[int]]) -> PropertyResult:
    """The ids every assistant turn ends with (its end-of-turn id and the trailer after it), and the
    ids a rendered tool call starts with (into ``ends``)."""
    head = await r.render([_USER], generation=True)
    # two answers with no common last character: what they share at the end is the template's
    one = await r.render([_USER, {"role": "assistant", "content": "Alpha"}], generation=False)
    two = await r.render([_USER, {"role": "assistant", "content": "Beta 7"}], generation=False)
    tail = []
    for a, b in zip(reversed(one), reversed(two), strict=False):
        if a != b:
            break
        tail.append(a)
    tail.reverse()
    try:
        with_call = await r.render([_USER, _assistant()], generation=False)
        plain = await r.render([_USER, {"role": "assistant", "content": ""}], generation=False)
    except ProbeRefused:  # a template that takes no tool calls as the engine passes them: no opening ids
        with_call = plain = []
    start = len(head) if with_call[:len(head)] == head else 0
    diverge = next((i for i, (a, b) in enumerate(zip(with_call[start:], plain[start:], strict=False)) if a != b), None)
    # the first id where a tool call's rendering departs from an empty answer's: its opening tag
    ends["open"] = with_call[start + diverge:start + diverge + 1] if diverge is not None else []
    if not tail:
        return PropertyResult("junction", True, False, "assistant turns share no common ending: a sampled turn "
                              "cannot be continued safely")
    ends["end"] = tail
    trailer = await r.text(tail[1:])
    return PropertyResult("junction", True, True,
                          f"an assistant turn ends with {await r.text(tail[:1])!r} then {trailer!r}: a sampled turn "
                          f"that stops at the end-of-turn id is continued after {len(tail) - 1} trailer id(s)",
                          facts={"turn_end_ids": tail, "trailer_text": trailer})


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
