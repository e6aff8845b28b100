"""What one session's agent calls say about its chains: the fidelity tips, each tip's turn view, and the
replies of its recent compaction calls.

Why one owner: the three are read and written together by the record step -- a call is classified
against the tips (``fidelity.py``; the observer is the session's fidelity tracker), its departure named
from its parent's view and the compaction summaries (``drift_cause.py``), and its own view kept while
it is a tip. A restart rebuilds the tips from the records (``session/restore.py``) and a close drops
all three; nothing else changes them.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from openenv_harness.recorder.chain.drift_cause import TurnView, break_cause, drift_cause
from openenv_harness.recorder.chain.fidelity import FidelityTracker, Transition

#: compaction replies remembered: a break whose history carries one of them was a compaction
SUMMARIES_KEPT = 4


@dataclass(eq=False)
class ChainObserver(FidelityTracker):
    """One session's chain tips (under the recorder's span budget; classifying a call against them,
    ``observe``, is the tracker's), their turn views and the compaction summaries."""

    _views: dict[str, TurnView] = field(default_factory=dict)
    _summaries: deque[str] = field(default_factory=lambda: deque(maxlen=SUMMARIES_KEPT))

    # -- naming a departure
    def departure_cause(self, transition: Transition, messages: list[Any], prompt: array[int],
                        certification: Any) -> str:
        """Why a ``replay_drift`` or ``break`` call (``transition``; ``messages`` and ``prompt``: its
        request and prompt ids) departs from its parent: named from the parent's kept turn view and the
        session's compaction summaries (``drift_cause.py``); ``unknown`` when the parent's view is gone."""
        parent = self._views.get(transition.parent) if transition.parent is not None else None
        if parent is None:
            return "unknown"
        if transition.fidelity == "replay_drift":
            if transition.drift_tokens == 0:
                return "resample"
            return drift_cause(parent, messages, prompt.tobytes(), certification, transition.divergence_at,
                               tuple(self._summaries))
        return break_cause(parent, messages, same_prompt=False, summaries=tuple(self._summaries),
                           certification=certification)

    @property
    def summaries(self) -> tuple[str, ...]:
        """The replies of the session's last few compaction calls, oldest first."""
        return tuple(self._summaries)

    def keep_view(self, node_id: str, view: TurnView) -> None:
        """Keep this call's view; views of calls that are no longer tips go."""
        self._views[node_id] = view
        tips = {t.node_id for t in self.tips}
        for node in [n for n in self._views if n not in tips]:
            del self._views[node]

    def note_compaction(self, summary: str) -> None:
        self._summaries.append(summary)

    # -- a close
    def release(self) -> None:
        """The session is closed: drop every tip, view and summary (memory follows live sessions)."""
        super().release()
        self._views.clear()
        self._summaries.clear()

    @property
    def tip_ids(self) -> list[str]:
        return [t.node_id for t in self.tips]
