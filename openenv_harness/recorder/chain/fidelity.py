"""How faithfully each agent call continues its chain (D4, and the numbers a reconciler will see).

For every agent call the recorder compares its canonical prompt ids with the chain tips of its
session -- prompt ids against prompt ids, never a decode:

- **exact**: the prompt starts with the tip's prompt + the tip's *sampled* completion. A trainer can
  append this call to the previous one with zero drift (TRL classifies it CLEAN).
- **replay_drift**: the prompt starts with the tip's prompt but not with its sampled completion --
  the agent's answer came back re-tokenized or re-serialized (e.g. rewritten tool-call JSON).
- **break**: no tip's prompt is a prefix -- the history itself changed (compaction, a sub-agent,
  edited messages). The divergence position is against the tip sharing the longest prefix.
- **root**: the session's first agent call.

State per session is a handful of tips (their last prompt and completion as bytes), bounded in
count, so memory follows context length, not history length. Comparisons are ``bytes.startswith``
and a binary-searched common prefix: C-speed, no per-token Python loop.

Between calls a tip's prompt is the largest thing a session holds (256 KB at 64k ids), and a
training run keeps many sessions open that are not calling. So with a ``budget`` (the recorder's
``SpanBudget``, shared with the prompt readers) the trackers of the sessions that called least
recently *sketch* their tips once their record is stored: block digests and the partial last block
(``prefix.py``, ~1/128 of the bytes plus one block). A sketch decides every prefix question exactly; only a break's
divergence position may need a sketched tip's prompt whole, and then the caller reads it back from
the store (``prompts_needed``, ``restore.read_tip_prompts``). The classes and positions are the same.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from openenv_harness.recorder.chain.prefix import BLOCK_BYTES, PromptSketch, block_digests, common_prefix_len

if TYPE_CHECKING:
    from openenv_harness.recorder.upstream.span_budget import SpanBudget

__all__ = ["MAX_TIPS", "FidelityTracker", "Transition", "common_prefix_len"]

MAX_TIPS = 4


@dataclass
class _Tip:
    node_id: str
    prompt: bytes | None  # None once sketched
    completion: bytes
    seq: int | None = None  # its record's, once stored: where a sketched prompt is read back
    sketch: PromptSketch | None = None

    @property
    def length(self) -> int:
        return len(self.prompt) if self.prompt is not None else self.sketch.length  # type: ignore[union-attr]


@dataclass
class Transition:
    fidelity: str  # root | exact | replay_drift | break
    parent: str | None = None
    divergence_at: int | None = None  # token position in this call's prompt
    drift_tokens: int = 0  # prompt tokens after the divergence point

    def as_dict(self) -> dict[str, object]:
        return {
            "class": self.fidelity,
            "parent": self.parent,
            "divergence_at": self.divergence_at,
            "drift_tokens": self.drift_tokens,
        }


@dataclass(slots=True, eq=False)
class _Prompt:
    """This call's prompt bytes, with its block digests computed only if a sketched tip asks."""

    data: bytes
    _digests: bytes | None = None

    @property
    def digests(self) -> bytes:
        if self._digests is None:
            self._digests = block_digests(self.data)
        return self._digests

    def starts_with(self, tip: _Tip) -> bool:
        if tip.prompt is not None:
            return self.data.startswith(tip.prompt)
        assert tip.sketch is not None
        return tip.sketch.is_prefix_of(self.data, self.digests)

    def shared(self, tip: _Tip) -> tuple[int, bool]:
        """``(bytes, exact)`` in common with the tip's prompt (``PromptSketch.common_prefix``)."""
        if tip.prompt is not None:
            return common_prefix_len(self.data, tip.prompt), True
        assert tip.sketch is not None
        return tip.sketch.common_prefix(self.data, self.digests)


@dataclass(eq=False)
class FidelityTracker:
    tips: list[_Tip] = field(default_factory=list)
    budget: SpanBudget | None = None

    def observe(self, node_id: str, prompt: array[int], completion: array[int],
                prompts: Mapping[str, bytes] | None = None) -> Transition:
        """Classify one agent call and make it the tip of its chain. ``prompts``: sketched tips'
        prompts read back (by node id) when ``prompts_needed`` asked for them."""
        if prompts:
            self._unsketch(prompts)
        p = _Prompt(prompt.tobytes())
        c = completion.tobytes()
        n_prompt = len(prompt)
        best = self._best_prefix(p)
        try:
            if best is not None:
                self.tips.remove(best)
                self.tips.append(_Tip(node_id, p.data, c))
                rest = p.data[best.length :]
                if rest.startswith(best.completion):
                    return Transition("exact", best.node_id)
                lcp = common_prefix_len(rest, best.completion)
                at = (best.length + lcp) // 4
                return Transition("replay_drift", best.node_id, at, n_prompt - at)
            if not self.tips:
                self.tips.append(_Tip(node_id, p.data, c))
                return Transition("root")
            nearest, nearest_lcp = None, -1
            for tip in self.tips:
                lcp, _ = p.shared(tip)  # exact unless a prompt it needed could not be read back
                if lcp > nearest_lcp:
                    nearest, nearest_lcp = tip, lcp
            self.tips.append(_Tip(node_id, p.data, c))
            del self.tips[:-MAX_TIPS]
            at = nearest_lcp // 4
            return Transition("break", nearest.node_id if nearest else None, at, n_prompt - at)
        finally:
            self._charge()

    def prompts_needed(self, prompt: array[int]) -> dict[str, int]:
        """Sketched tips whose whole prompt ``observe`` would need for this prompt (a break whose
        divergence lies inside one of their whole blocks), as ``{node_id: seq}``; usually empty."""
        if all(tip.prompt is not None for tip in self.tips):
            return {}
        p = _Prompt(prompt.tobytes())
        if not self.tips or self._best_prefix(p) is not None:
            return {}
        shared = [(tip, *p.shared(tip)) for tip in self.tips]
        floor = max(lcp for _, lcp, _ in shared)
        return {tip.node_id: tip.seq for tip, lcp, exact in shared
                if not exact and lcp + BLOCK_BYTES > floor and tip.seq is not None}

    def _best_prefix(self, p: _Prompt) -> _Tip | None:
        """The longest tip whose prompt starts ``p`` (the first such in order, on a tie). Whole tips
        are tried first, so a chain continuing one never hashes ``p`` for a shorter sketched tip."""
        found = [(i, t) for i, t in enumerate(self.tips) if t.prompt is not None and p.starts_with(t)]
        floor = max((t.length for _, t in found), default=-1)
        found += [(i, t) for i, t in enumerate(self.tips)
                  if t.prompt is None and t.length >= floor and p.starts_with(t)]
        return min(found, key=lambda it: (-it[1].length, it[0]))[1] if found else None

    def placed(self, node_id: str, seq: int) -> None:
        """The record of ``node_id`` is stored as ``seq``: its tip may be sketched from now on."""
        for tip in self.tips:
            if tip.node_id == node_id:
                tip.seq = seq

    def drop_spans(self) -> None:
        """The budget needs the room: sketch every tip whose prompt can be read back."""
        for tip in self.tips:
            if tip.prompt is not None and tip.seq is not None:
                tip.sketch, tip.prompt = PromptSketch(tip.seq, tip.prompt), None

    def held_bytes(self) -> int:
        return sum(len(t.prompt) for t in self.tips if t.prompt is not None)

    def _unsketch(self, prompts: Mapping[str, bytes]) -> None:
        for tip in self.tips:
            data = prompts.get(tip.node_id)
            if tip.prompt is None and data is not None and tip.sketch is not None and len(data) == tip.sketch.length:
                tip.prompt, tip.sketch = data, None

    def adopt(self, rebuilt: FidelityTracker) -> None:
        """Take the tips a restart rebuilt from the records, where this tracker has none yet; they are
        charged to this tracker's budget (``rebuilt`` has none)."""
        if not self.tips:
            self.tips = rebuilt.tips
            rebuilt.tips = []
            self._charge()

    def release(self) -> None:
        """Drop every tip and what they held against the budget."""
        self.tips = []
        if self.budget is not None:
            self.budget.release(self)

    def _charge(self) -> None:
        if self.budget is not None:
            self.budget.charge(self, self.held_bytes())
