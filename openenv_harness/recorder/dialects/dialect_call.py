"""What the reply end of a dialect needs from its request end, for one call: plain data the flow carries
(``call/flow.py``) between the dialect's two ends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openenv_harness.recorder.dialects.memory import ReplayMemory


@dataclass
class DialectCall:
    """What the reply end needs from the request end of one call (and, for a dialect that records
    them, the argument text the model sampled, found by the record step)."""

    model: str | None = None
    echo: dict[str, Any] = field(default_factory=dict)
    #: per tool call of the reply, the argument text the model sampled (``sampled.raw_arguments``)
    raw_arguments: list[str | None] = field(default_factory=list)

    def arguments_for(self, index: int, call_id: str, parsed: Any, memory: ReplayMemory) -> Any:
        """What to hand the agent as a call's arguments: the sampled text when it is known (from
        this reply's tokens, or remembered from the first time this reply was sent), else the
        engine's parsed string."""
        if index < len(self.raw_arguments) and self.raw_arguments[index] is not None:
            return self.raw_arguments[index]
        return memory.sampled(call_id) or parsed
