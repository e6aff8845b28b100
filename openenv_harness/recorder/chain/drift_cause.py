"""Why an agent call does not continue its chain exactly: a cause for every replay drift and break.

``fidelity.py`` says *that* a call's prompt departs from its parent's prompt + sampled ids, and
where. This module says *why*, from what the recorder can see: the parent's reply as the engine
sent it, the messages of both calls, and the ids. Causes, first match wins:

replay drift (the history up to the parent's request is intact; the parent's answer came back
different):
- ``reasoning_dropped``: the reply had reasoning; the replayed assistant message has none.
- ``reasoning_renamed``: it came back under another field name that the engine does not render
  (OpenCode replays ``reasoning`` as ``reasoning_content``; vLLM 0.32's chat route renames that back
  to ``reasoning`` and renders it, an engine without that rename drops it). Where the certification
  (probed through the render route, as the chat route renders) says the new name is rendered, the
  rename renders the same and is no cause; without a certification a rename is named.
- ``reasoning_not_rendered``: it came back under a name (the same or another) the served template
  does not render, and the sampled name is not rendered either (per the template certification).
- ``tool_arguments_reserialized``: a tool call's argument text came back re-serialized (the same
  JSON, other spacing or key order; or an object instead of the sampled text) in a way the served
  template renders differently (a template that normalizes spacing, per the certification's
  ``tool_args_roundtrip`` facts, renders a respaced replay the same: that is no cause).
- ``content_reflattened``: the text came back as a list of parts (or the reverse).
- ``edited_message``: the replayed answer's text differs from what was sampled.
- ``tag_sampled_as_text``: the answer came back verbatim, but the model sampled the tool-call tag
  as text pieces and the template renders it as its special id (certification says which id).
- ``template_rerenders_turn``: the answer came back as sampled (or only in ways the template
  renders the same), but the served template renders a finished assistant turn differently once more
  follows it (certification: ``tool_prefix`` or ``assistant_stable`` failed -- Qwen3's original
  template drops an empty think block from earlier turns).
- ``tool_arguments_restyled``: the template normalizes argument spacing, and the argument text the
  model sampled (as the agent replayed it, or as the engine's parser returned it) is in another
  style than the parser's: the template renders the sampled arguments in its own JSON style.
- ``retokenized``: verbatim answer, other ids: the template re-tokenizes what was sampled.
- ``unknown``.

break (the history itself changed):
- ``resample``: the same prompt as the parent (a retry or a sibling sample).
- ``sub_agent``: another system prompt than the parent's.
- ``history_rewritten``: earlier messages were replaced or removed (compaction): a new message holds
  the reply of a recent compaction call, or the conversation did not grow past the parent.
- ``edited_message``: an earlier message changed, the conversation kept its length.
- ``junction_retokenized``: no message changed, the conversation grew, yet the prompt departs inside
  the parent's own prompt, and the certification's ``turn_start`` failed: the template tokenizes the
  end of the generation prompt together with the sampled turn (Qwen3.5's think templates, a turn with no
  reasoning after ``<think>\\n``).
- ``unknown``.

Per chain tip the session keeps a ``TurnView``: the reply message (small), the request's message
count and one crc32 per message -- not the history itself.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import orjson

REASONING_FIELDS = ("reasoning", "reasoning_content", "thinking")


@dataclass(frozen=True)
class TurnView:
    reply: dict[str, Any]
    message_crcs: tuple[int, ...]
    completion: bytes  # the sampled ids as uint32 bytes


def _crc(message: Any) -> int:
    try:
        return zlib.crc32(orjson.dumps(message, option=orjson.OPT_SORT_KEYS))
    except TypeError:
        return zlib.crc32(repr(message).encode())


def turn_view(messages: list[Any], reply: dict[str, Any] | None, completion: bytes) -> TurnView:
    return TurnView(reply or {}, tuple(_crc(m) for m in messages), completion)


def _reasoning(message: dict[str, Any]) -> tuple[str, str] | None:
    """``(field, text)`` of the message's first non-empty reasoning field, None when it has none."""
    for name in REASONING_FIELDS:
        value = message.get(name)
        if isinstance(value, str) and value:
            return name, value
    return None


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return None


def _json_equal(a: Any, b: Any) -> bool:
    try:
        pa = orjson.loads(a) if isinstance(a, str) else a
        pb = orjson.loads(b) if isinstance(b, str) else b
    except orjson.JSONDecodeError:
        return False
    equal: bool = pa == pb  # JSON values: == gives a bool
    return equal


def _same_order_json(a: Any, b: Any) -> bool:
    """The same JSON with the same key order: what a spacing-normalizing template renders the same."""
    try:
        pa = orjson.loads(a) if isinstance(a, str) else a
        pb = orjson.loads(b) if isinstance(b, str) else b
        return orjson.dumps(pa) == orjson.dumps(pb)
    except (orjson.JSONDecodeError, TypeError):
        return False


def _argument_texts(reply: dict[str, Any], replayed: dict[str, Any]) -> list[tuple[Any, Any]]:
    pairs = []
    for a, b in zip(reply.get("tool_calls") or [], replayed.get("tool_calls") or [], strict=False):
        fa = (a or {}).get("function") or {}
        fb = (b or {}).get("function") or {}
        pairs.append((fa.get("arguments"), fb.get("arguments")))
    return pairs


def _answer_cause(reply: dict[str, Any], replayed: dict[str, Any], rendered_fields: dict[str, bool],
                  respaces: bool = False) -> str | None:
    """A difference between the sampled answer and how it came back, or None when verbatim."""
    sampled = _reasoning(reply)
    if sampled is not None:
        name = sampled[0]
        back = _reasoning(replayed)
        if back is None:
            return "reasoning_dropped"
        back_name = back[0]
        if back_name != name and not rendered_fields:
            return "reasoning_renamed"  # no certification says how the new name renders
        if rendered_fields and rendered_fields.get(back_name) is False:
            return "reasoning_renamed" if back_name != name and rendered_fields.get(name) else "reasoning_not_rendered"
        # a new name the engine renders like the old (vLLM 0.32's chat route renames reasoning_content
        # to reasoning before templating): the rename is no cause
    sampled_calls = reply.get("tool_calls") or []
    back_calls = replayed.get("tool_calls") or []
    for a, b in _argument_texts(reply, replayed):
        if a != b:
            if respaces and _same_order_json(a, b):
                continue  # the template renders both the same
            return "tool_arguments_reserialized" if _json_equal(a, b) else "edited_message"
    if len(sampled_calls) != len(back_calls):
        return "edited_message"
    content, back_content = reply.get("content"), replayed.get("content")
    if type(content) is not type(back_content) and _text(content) == _text(back_content) and \
            (isinstance(content, list) or isinstance(back_content, list)):
        return "content_reflattened"
    if (_text(content) or "") != (_text(back_content) or ""):
        return "edited_message"
    return None


def _tag_at(prompt: bytes, divergence_at: int | None, completion: bytes, open_ids: list[int]) -> bool:
    """The prompt holds the tool-call tag's special id exactly where it departs from prompt + sampled,
    and the model never sampled that id: it sampled the tag as text (as a tool call, or as text an
    agent replays as content after a truncated call), and the template re-tokenizes it as the id."""
    if divergence_at is None or not open_ids or not 0 <= divergence_at * 4 < len(prompt):
        return False
    tag = open_ids[0].to_bytes(4, "little")
    return prompt[divergence_at * 4:divergence_at * 4 + 4] == tag and not holds_id(completion, tag)


def holds_id(ids: bytes, tag: bytes) -> bool:
    """Whether the id ``tag`` (its 4 bytes) is one of ``ids`` (little-endian uint32s): a search at C
    speed that skips matches straddling two ids. Why: a set of every prompt id, built per drifting
    call, was a fifth of the recorder's work on a 5,000-id prompt, and grows with the prompt."""
    at = ids.find(tag)
    while at != -1:
        if at % 4 == 0:
            return True
        at = ids.find(tag, at + 1)
    return False


def drift_cause(parent: TurnView, messages: list[Any], prompt: bytes, certification: Any = None,
                divergence_at: int | None = None, summaries: Any = ()) -> str:
    """The cause of a replay drift of ``messages`` (this call's request) from ``parent``; where the
    ids first depart (``divergence_at``, a token index) decides when it shows the tag as text.

    A rewritten history can still share most of the parent's ids (a long system prompt and tool list
    kept by compaction): it is classified a drift by its ids, and named here by its messages -- a
    compaction summary, or (no replayed assistant turn where the parent's reply was) the change a
    break would be named by."""
    if summaries and _carries_summary(messages, [_crc(m) for m in messages], parent.message_crcs, summaries):
        return "history_rewritten"
    n = len(parent.message_crcs)
    replayed = messages[n] if len(messages) > n and isinstance(messages[n], dict) else None
    if replayed is None or replayed.get("role") != "assistant":
        return break_cause(parent, messages, same_prompt=False, summaries=summaries, certification=certification)
    if _tag_at(prompt, divergence_at, parent.completion, list(getattr(certification, "tool_call_open_ids", None) or [])):
        return "tag_sampled_as_text"  # the first difference: whatever else the agent changed comes later
    rendered: dict[str, bool] = {}
    respaces = rerenders = False
    for prop in getattr(certification, "properties", None) or []:
        if prop.name == "assistant_stable":
            rendered = (prop.facts or {}).get("rendered") or {}
        elif prop.name == "tool_args_roundtrip":
            respaces = bool(((prop.facts or {}).get("same_as_spaced") or {}).get("compact"))
        if prop.name in ("tool_prefix", "assistant_stable") and getattr(prop, "passed", None) is False:
            rerenders = True
    cause = _answer_cause(parent.reply, replayed, rendered, respaces)
    if cause is not None:
        return cause
    open_ids = list(getattr(certification, "tool_call_open_ids", None) or [])
    if parent.reply.get("tool_calls") and open_ids:
        tag = open_ids[0].to_bytes(4, "little")
        if not holds_id(parent.completion, tag) and holds_id(prompt, tag):
            return "tag_sampled_as_text"
    if rerenders:
        return "template_rerenders_turn"
    if respaces and any(isinstance(a, str) and isinstance(b, str) and a != b
                        for a, b in _argument_texts(parent.reply, replayed)):
        return "tool_arguments_restyled"
    return "retokenized"


#: a summary shorter than this could be found in a history by chance
_MIN_SUMMARY = 8


def _carries_summary(messages: list[Any], crcs: list[int], old: tuple[int, ...], summaries: Any) -> bool:
    """A message the parent did not have holds the text a compaction call replied with."""
    texts = [t.strip() for t in summaries if isinstance(t, str) and len(t.strip()) >= _MIN_SUMMARY]
    if not texts:
        return False
    known = set(old)
    for message, crc in zip(messages, crcs, strict=False):
        if crc in known or not isinstance(message, dict):
            continue
        body = _text(message.get("content")) or ""
        if any(t in body for t in texts):
            return True
    return False


def _failed(certification: Any, name: str) -> bool:
    return any(p.name == name and getattr(p, "passed", None) is False
               for p in getattr(certification, "properties", None) or [])


def break_cause(parent: TurnView, messages: list[Any], same_prompt: bool, summaries: Any = (),
                certification: Any = None) -> str:
    """The cause of a break of ``messages`` against the nearest earlier call ``parent``.

    ``summaries``: the replies of the session's recent compaction calls (aux calls a harness's
    ``*-compaction`` rule matched). A history that newly carries one was rewritten by compaction --
    whatever its shape, which alone often looks like an edited message (OpenCode keeps the system
    prompt and the message count can grow)."""
    if same_prompt:
        return "resample"
    crcs = [_crc(m) for m in messages]
    old = parent.message_crcs
    if _carries_summary(messages, crcs, old, summaries):
        return "history_rewritten"
    if old and crcs and old[0] != crcs[0] and _role(messages[0]) in ("system", "developer"):
        return "sub_agent"
    first = next((i for i, (a, b) in enumerate(zip(old, crcs, strict=False)) if a != b), None)
    if first is None:
        if len(crcs) < len(old):
            return "history_rewritten"
        # the messages only grew, yet the prompt departs inside the parent's: the template re-renders
        # the generation prompt's end together with the sampled turn (a failed certified turn start;
        # certificates before version 3 held that fact in their junction)
        retokenized = _failed(certification, "turn_start") or (
            getattr(certification, "version", 3) < 3 and _failed(certification, "junction"))
        return "junction_retokenized" if retokenized else "unknown"
    if len(crcs) < len(old) + 1:  # the conversation did not grow past the parent: it was rewritten
        same_after = sum(1 for a, b in zip(old[first + 1:], crcs[first + 1:], strict=False) if a == b)
        if len(crcs) == len(old) and same_after == len(old) - first - 1:
            return "edited_message"
        return "history_rewritten"
    return "edited_message" if crcs[first + 1:len(old)] == list(old[first + 1:]) else "history_rewritten"


def _role(message: Any) -> str | None:
    return message.get("role") if isinstance(message, dict) else None
