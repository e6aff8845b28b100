"""The probe prefix's rendering, kept per engine: the same render request always renders the same.

Why: every continued call cuts the engine's rendering of its new messages off a probe prefix (a
user turn and an assistant tool call with the real tool name, ``prompt_mode._suffix_ids``). That
prefix depends only on what is rendered -- model, tools, template arguments, tool choice, the tool
name -- so it is rendered once per engine and request, not once per session: a session's first
continued call then waits on one render instead of two in a row. The key is the render request
itself (its JSON) with the certified turn-end ids it was checked against, so a different request or
a re-certified template renders afresh; nothing sampled from can differ from an uncached render.

The probe is rendered without the request's tool list where the engine allows it (``needs_tools``):
a template puts the tool list in the system turn, which the probe's cut discards, so rendering it
cost every continued call the tools' JSON and its tokenizing for nothing -- on the real vLLM, 14-16
ms against 2-3 ms per suffix render with OpenCode's ten tools (~5,200 ids of them). An engine whose
template renders the new messages differently without the tools shows it at the certification (the
suffix is not the tail of the full render), renders that call's suffix again with the tools, and is
remembered here: its later calls render with the tools from the start.
"""

from __future__ import annotations

import weakref
from typing import Any

import orjson

from openenv_harness.recorder.upstream.base import Upstream

MAX_PER_ENGINE = 256


class ProbePrefixes:
    def __init__(self) -> None:
        self._by_engine: weakref.WeakKeyDictionary[Upstream, dict[bytes, list[int]]] = weakref.WeakKeyDictionary()
        self._with_tools: weakref.WeakSet[Upstream] = weakref.WeakSet()

    def needs_tools(self, upstream: Upstream) -> bool:
        """Whether this engine's new messages render only with the tool list (see the module's docstring)."""
        return upstream in self._with_tools

    def learn_needs_tools(self, upstream: Upstream) -> None:
        self._with_tools.add(upstream)

    @staticmethod
    def _key(request: dict[str, Any], turn_end: list[int]) -> bytes:
        return orjson.dumps([request, turn_end], option=orjson.OPT_SORT_KEYS)

    def get(self, upstream: Upstream, request: dict[str, Any], turn_end: list[int]) -> list[int] | None:
        return self._by_engine.get(upstream, {}).get(self._key(request, turn_end))

    def put(self, upstream: Upstream, request: dict[str, Any], turn_end: list[int], ids: list[int]) -> None:
        table = self._by_engine.setdefault(upstream, {})
        table[self._key(request, turn_end)] = ids
        while len(table) > MAX_PER_ENGINE:
            del table[next(iter(table))]


probe_prefixes = ProbePrefixes()
