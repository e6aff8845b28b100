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
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

MAX_TIPS = 4


def common_prefix_len(a: bytes, b: bytes) -> int:
    """Length of the common prefix of two byte strings.

    ``startswith`` settles the common case (one is a prefix of the other) without copying; otherwise
    a binary search compares only the *untested* part of each range, so the bytes copied add up to
    about ``len`` once rather than ``len * log(len)``.
    """
    short, long_ = (a, b) if len(a) <= len(b) else (b, a)
    if long_.startswith(short):
        return len(short)
    lo, hi = 0, len(short)  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass
class _Tip:
    node_id: str
    prompt: bytes
    completion: bytes


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


@dataclass
class FidelityTracker:
    tips: list[_Tip] = field(default_factory=list)

    def observe(self, node_id: str, prompt: array, completion: array) -> Transition:
        """Classify one agent call and make it the tip of its chain."""
        p = prompt.tobytes()
        c = completion.tobytes()
        n_prompt = len(prompt)
        best: _Tip | None = None
        for tip in self.tips:
            if p.startswith(tip.prompt) and (best is None or len(tip.prompt) > len(best.prompt)):
                best = tip
        if best is not None:
            self.tips.remove(best)
            self.tips.append(_Tip(node_id, p, c))
            if p.startswith(best.prompt + best.completion):
                return Transition("exact", best.node_id)
            lcp = common_prefix_len(p[len(best.prompt) :], best.completion)
            at = (len(best.prompt) + lcp) // 4
            return Transition("replay_drift", best.node_id, at, n_prompt - at)
        if not self.tips:
            self.tips.append(_Tip(node_id, p, c))
            return Transition("root")
        nearest, nearest_lcp = None, -1
        for tip in self.tips:
            lcp = common_prefix_len(p, tip.prompt)
            if lcp > nearest_lcp:
                nearest, nearest_lcp = tip, lcp
        self.tips.append(_Tip(node_id, p, c))
        del self.tips[:-MAX_TIPS]
        at = nearest_lcp // 4
        return Transition("break", nearest.node_id if nearest else None, at, n_prompt - at)
