"""The engine's renders an incremental call is built from, and the checks on their ids.

Every id a continued prompt holds comes from the engine: the checkpoint (ids it saw and sampled),
the certified turn-end trailer, and its rendering of only the new messages, cut off a probe prefix
(``suffix_ids``). ``certified`` is the check that makes the splice safe: the new messages' ids are the
tail of the engine's full render of the same messages, right after a turn end there.
"""

from __future__ import annotations

from array import array
from itertools import compress, count
from operator import ne
from typing import Any

import numpy as np

from openenv_harness.recorder.prompt_modes.engine_facts import EngineFacts
from openenv_harness.recorder.prompt_modes.state import Checkpoint, Fallback, IncrementalState
from openenv_harness.recorder.upstream.base import Upstream
from openenv_harness.recorder.upstream.routes import RENDER

_PROBE_USER = {"role": "user", "content": "."}


async def render(upstream: Upstream, state: IncrementalState, body: dict[str, Any], session: str,
                 affinity: str | None) -> dict[str, Any]:
    """The engine's rendering of a chat request, its ids checked (``token_ids``) and as an array
    (``token_array``); an engine without the route is remembered on the session's state."""
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
    rendered["token_array"] = id_array(ids, RENDER)
    rendered["token_ids"] = rendered["token_array"].tolist()
    return rendered


async def suffix_ids(upstream: Upstream, facts: EngineFacts, state: IncrementalState, checkpoint: Checkpoint,
                     suffix: list[Any], turn_end: list[int], request: dict[str, Any], *, generation: bool,
                     session: str, affinity: str | None, with_tools: bool) -> tuple[list[int], bool]:
    """The new messages' ids: rendered after a probe prefix ending like the real one, prefix cut off;
    and whether the template re-rendered the probe's assistant turn (``probe_cut``). ``request`` is
    the call's upstream body, whose rendering fields the probe shares; the tool list is rendered only
    ``with_tools`` (``engine_facts``: it lands in the part cut off)."""
    calls = checkpoint.reply.get("tool_calls") or []
    name = ((calls[0].get("function") or {}).get("name") if calls and isinstance(calls[0], dict) else None)
    assistant: dict[str, Any] = {"role": "assistant", "content": "" if name else "."}
    if name:
        assistant["tool_calls"] = [{"id": "call_probe", "type": "function",
                                    "function": {"name": name, "arguments": "{}"}}]
    kept = ("model", "tools", "chat_template_kwargs", "tool_choice") if with_tools else ("model", "chat_template_kwargs")
    base = {k: v for k, v in request.items() if k in kept}
    probe = {**base, "messages": [_PROBE_USER, assistant], "add_generation_prompt": False}
    prefix = facts.probe_prefix(probe, turn_end)
    if prefix is None:
        rendered = await render(upstream, state, probe, session, affinity)
        prefix = rendered["token_ids"]
        if prefix[-len(turn_end):] != turn_end:
            raise Fallback("junction_uncertified", "the probe's assistant turn does not end with the certified "
                           "turn-end ids")
        facts.keep_probe_prefix(probe, turn_end, prefix)
    whole = await render(upstream, state, {**base, "messages": [_PROBE_USER, assistant, *suffix],
                                           "add_generation_prompt": generation}, session, affinity)
    ids = whole["token_ids"]
    cut = probe_cut(prefix, ids, turn_end)
    if cut is None:
        raise Fallback("suffix_not_certified", "the probe prefix is not kept when the new messages follow it, "
                       "and its assistant turn's end cannot be found in the render")
    return ids[cut:], cut != len(prefix)


def id_array(values: Any, route: str) -> array[int]:
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
    The suffix is then still certified against the engine's full render (``certified``)."""
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


def render_diff(sampled: array[int], full: array[int]) -> dict[str, Any]:
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
