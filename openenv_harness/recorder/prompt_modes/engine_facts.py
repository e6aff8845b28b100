"""What the incremental mode learned about each engine by asking it, held by the recorder's context.

Why per engine and not per session: each fact depends only on the engine (and, for a probe prefix,
on the render request), so learning it once spares every session's first continued call a round
trip. Why on the context (``RecorderContext.engine_facts``) and not in a module: two recorders in
one process may front different engines under the same upstream class, and a test builds one
recorder per app. Nothing here changes what is sampled -- only how many engine calls it takes.

- **probe prefixes.** Every continued call cuts the engine's rendering of its new messages off a
  probe prefix (a user turn and an assistant tool call with the real tool name,
  ``rendering.suffix_ids``). That prefix depends only on what is rendered -- model, tools, template
  arguments, tool choice, the tool name -- so it is rendered once per engine and request. The key is
  the render request itself (its JSON) with the certified turn-end ids it was checked against, so a
  different request or a re-certified template renders afresh.
- **whether the probe needs the tool list.** A template puts the tool list in the system turn, which
  the probe's cut discards, so the probe is rendered without it where the engine allows; an engine
  whose template renders the new messages differently without the tools shows it at the
  certification, renders that call's suffix again with the tools, and is remembered here.
- **its id-sampling route** (``id_sampling.sampler_for``): probed once, the probe shared by the
  calls that wait on it; a probe that failed is tried again.
- **whether it refuses a one-step parse** (``sample_parse``): then every later call parses in two.
"""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass, field
from typing import Any

import orjson

from openenv_harness.recorder.prompt_modes.id_sampler import IdSampler
from openenv_harness.recorder.upstream.base import Upstream

MAX_PROBE_PREFIXES = 256


@dataclass
class EngineFacts:
    """One engine's learned facts (see the module's docstring)."""

    probe_prefixes: dict[bytes, list[int]] = field(default_factory=dict)
    probe_needs_tools: bool = False
    sampler_probe: asyncio.Future[IdSampler] | None = None
    two_step_only: bool = False

    @staticmethod
    def _key(request: dict[str, Any], turn_end: list[int]) -> bytes:
        return orjson.dumps([request, turn_end], option=orjson.OPT_SORT_KEYS)

    def probe_prefix(self, request: dict[str, Any], turn_end: list[int]) -> list[int] | None:
        return self.probe_prefixes.get(self._key(request, turn_end))

    def keep_probe_prefix(self, request: dict[str, Any], turn_end: list[int], ids: list[int]) -> None:
        table = self.probe_prefixes
        table[self._key(request, turn_end)] = ids
        while len(table) > MAX_PROBE_PREFIXES:
            del table[next(iter(table))]


class EngineFactsTable:
    """Each engine's facts, by its upstream object (dropped with it)."""

    def __init__(self) -> None:
        self._by_engine: weakref.WeakKeyDictionary[Upstream, EngineFacts] = weakref.WeakKeyDictionary()

    def of(self, upstream: Upstream) -> EngineFacts:
        facts = self._by_engine.get(upstream)
        if facts is None:
            facts = self._by_engine[upstream] = EngineFacts()
        return facts
