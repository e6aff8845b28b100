"""Compare the *shapes* of JSON replies: keys and JSON types, never values.

Why: a test double is only worth its speed while it answers like the real thing where a client
can see it. Values differ between two engines (ids, texts, timestamps), but which keys are there
and whether each is a string, a number or ``null`` must not -- that is what breaks parsers in
production. ``assert_same_shape`` reports every difference at once, as paths::

    $.choices[].message.reasoning   real: null   reference: string
    $.usage.completion_tokens_details   real: null   reference: (absent)

A shape is the set of ``(path, type)`` pairs of a document, list positions folded into ``[]`` (so
a list's shape is the union of its items'). Types: ``object``, ``array``, ``string``, ``int``,
``float``, ``bool``, ``null``.

Streams are compared per kind of chunk (``first``, ``token``, ``finish``, ``usage``) and per kind
of delta (``role``, ``content``, ``reasoning``, ``tool_head``, ``tool_args``, ``empty``): the number
of chunks is a value, the kinds that occur and each kind's shape are not.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

Shape = frozenset[tuple[str, str]]


def _type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def json_shape(value: Any, path: str = "$") -> Shape:
    """The ``(path, type)`` pairs of a parsed JSON document."""
    pairs = {(path, _type(value))}
    if isinstance(value, dict):
        for key, item in value.items():
            pairs |= json_shape(item, f"{path}.{key}")
    elif isinstance(value, list):
        for item in value:
            pairs |= json_shape(item, f"{path}[]")
    return frozenset(pairs)


def _by_path(shape: Iterable[tuple[str, str]]) -> dict[str, set[str]]:
    paths: dict[str, set[str]] = defaultdict(set)
    for path, kind in shape:
        paths[path].add(kind)
    return paths


def shape_diff(expected: Shape, actual: Shape, names: tuple[str, str] = ("real", "reference"),
               ignore: Iterable[str] = ()) -> list[str]:
    """One line per path whose types differ (``(absent)`` where a side lacks the key)."""
    skip = tuple(ignore)
    left, right = _by_path(expected), _by_path(actual)
    lines = []
    for path in sorted(set(left) | set(right)):
        if any(path == p or path.startswith(p + ".") or path.startswith(p + "[") for p in skip):
            continue
        a, b = left.get(path, set()), right.get(path, set())
        if a != b:
            lines.append(f"{path}   {names[0]}: {'|'.join(sorted(a)) or '(absent)'}   "
                         f"{names[1]}: {'|'.join(sorted(b)) or '(absent)'}")
    return lines


def assert_same_shape(expected: Any, actual: Any, what: str, *, names: tuple[str, str] = ("real", "reference"),
                      ignore: Iterable[str] = ()) -> None:
    """Raise ``AssertionError`` listing every path where the two documents' shapes differ."""
    lines = shape_diff(json_shape(expected), json_shape(actual), names, ignore)
    if lines:
        raise AssertionError(f"{what}: the replies differ in shape ({len(lines)} paths):\n  " + "\n  ".join(lines))


def chunk_kind(chunk: dict[str, Any]) -> str:
    """``usage`` (no choices), ``first`` (the role), ``finish`` (a finish reason) or ``token``."""
    choices = chunk.get("choices") or []
    if not choices:
        return "usage"
    choice = choices[0]
    if "role" in (choice.get("delta") or {}):
        return "first"
    return "finish" if choice.get("finish_reason") is not None else "token"


def delta_kind(delta: dict[str, Any]) -> str:
    """What a delta carries: ``role``, ``tool_head``, ``tool_args``, ``reasoning``, ``content`` or ``empty``."""
    if "role" in delta:
        return "role"
    calls = delta.get("tool_calls") or []
    if any("id" in call for call in calls):
        return "tool_head"
    if calls:
        return "tool_args"
    if delta.get("reasoning") or delta.get("reasoning_content"):
        return "reasoning"
    if delta.get("content"):
        return "content"
    return "empty"


def stream_shapes(events: list[Any]) -> dict[str, Shape]:
    """Per kind of chunk (envelope without its delta) and per kind of delta, the union of shapes.

    ``events`` are the parsed ``data:`` payloads in order; it must end with ``"[DONE]"``.
    """
    if not events or events[-1] != "[DONE]":
        raise AssertionError(f"a stream must end with data: [DONE]; got {events[-1:]!r}")
    shapes: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for event in events[:-1]:
        envelope = {**event, "choices": [{k: v for k, v in c.items() if k != "delta"} for c in event["choices"]]}
        shapes[f"chunk:{chunk_kind(event)}"] |= json_shape(envelope)
        for choice in event["choices"]:
            delta = choice.get("delta") or {}
            shapes[f"delta:{delta_kind(delta)}"] |= json_shape(delta)
    return {kind: frozenset(pairs) for kind, pairs in shapes.items()}


def chunk_sequence(events: list[Any]) -> list[str]:
    """The kinds of chunk in order, runs collapsed: e.g. ``first, token, finish, usage``."""
    kinds: list[str] = []
    for event in events[:-1] if events and events[-1] == "[DONE]" else events:
        kind = chunk_kind(event)
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
    return kinds


def assert_same_stream_shape(expected: list[Any], actual: list[Any], what: str, *,
                             names: tuple[str, str] = ("real", "reference")) -> None:
    """The same order of chunk kinds, and the same kinds of chunk and delta, each of the same
    shape, in streams ending with ``[DONE]``."""
    left, right = stream_shapes(expected), stream_shapes(actual)
    lines = []
    order = chunk_sequence(expected), chunk_sequence(actual)
    if order[0] != order[1]:
        lines.append(f"chunk order   {names[0]}: {', '.join(order[0])}   {names[1]}: {', '.join(order[1])}")
    for kind in sorted(set(left) | set(right)):
        if kind not in left or kind not in right:
            lines.append(f"{kind} occurs only in the {names[0] if kind in left else names[1]} stream")
            continue
        lines += [f"{kind} {line}" for line in shape_diff(left[kind], right[kind], names)]
    if lines:
        raise AssertionError(f"{what}: the streams differ in shape ({len(lines)}):\n  " + "\n  ".join(lines))
