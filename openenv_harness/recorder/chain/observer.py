"""What one session's agent calls say about its chains: the fidelity tips, each tip's turn view, and the
replies of its recent compaction calls.

Why one owner: the three are read and written together by the record step -- a call is classified
against the tips (``fidelity.py``), its departure named from its parent's view and the compaction
summaries (``drift_cause.py``), and its own view kept while it is a tip. A restart rebuilds the tips
from the records (``session/restore.py``) and a close drops all three; nothing else changes them.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING

from openenv_harness.recorder.chain.drift_cause import TurnView
from openenv_harness.recorder.chain.fidelity import FidelityTracker, Transition

if TYPE_CHECKING:
    from openenv_harness.recorder.upstream.span_budget import SpanBudget

#: compaction replies remembered: a break whose history carries one of them was a compaction
SUMMARIES_KEPT = 4


class ChainObserver:
    """One session's chain tips (under the recorder's span budget), their views and compaction summaries."""

    __slots__ = ("_summaries", "_tracker", "_views")

    def __init__(self, budget: SpanBudget | None = None) -> None:
        self._tracker = FidelityTracker(budget=budget)
        self._views: dict[str, TurnView] = {}
        self._summaries: deque[str] = deque(maxlen=SUMMARIES_KEPT)

    # -- classifying a call
    def prompts_needed(self, prompt: array[int]) -> dict[str, int]:
        """Sketched tips whose prompt must be read back before ``observe`` (``FidelityTracker``)."""
        return self._tracker.prompts_needed(prompt)

    def observe(self, node_id: str, prompt: array[int], completion: array[int],
                prompts: Mapping[str, bytes] | None = None) -> Transition:
        """Classify one agent call against the tips and make it the tip of its chain."""
        return self._tracker.observe(node_id, prompt, completion, prompts)

    def placed(self, node_id: str, seq: int) -> None:
        """The call's record is stored as ``seq``: its prompt can be read back from there."""
        self._tracker.placed(node_id, seq)

    # -- naming a departure
    def view(self, node_id: str | None) -> TurnView | None:
        """The turn view kept for a tip (None: not a tip, or never seen)."""
        return self._views.get(node_id) if node_id is not None else None

    @property
    def summaries(self) -> tuple[str, ...]:
        """The replies of the session's last few compaction calls, oldest first."""
        return tuple(self._summaries)

    def keep_view(self, node_id: str, view: TurnView) -> None:
        """Keep this call's view; views of calls that are no longer tips go."""
        self._views[node_id] = view
        tips = {t.node_id for t in self._tracker.tips}
        for node in [n for n in self._views if n not in tips]:
            del self._views[node]

    def note_compaction(self, summary: str) -> None:
        self._summaries.append(summary)

    # -- a restart, a close
    def adopt(self, rebuilt: FidelityTracker) -> None:
        """Take the tips a restart rebuilt from the records (``session/restore.py``), under this budget."""
        self._tracker.adopt(rebuilt)

    def release(self) -> None:
        """The session is closed: drop every tip, view and summary (memory follows live sessions)."""
        self._tracker.release()
        self._views.clear()
        self._summaries.clear()

    @property
    def tip_ids(self) -> list[str]:
        return [t.node_id for t in self._tracker.tips]
