"""``full_history`` (the default): the agent's messages, rendered in full by the engine each turn.

Replay drift (the agent re-spelling what the model said) is detected afterwards, by the record
step's fidelity tracking; the mode itself keeps nothing between calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openenv_harness.recorder.prompt_modes.base import ModeCall, Sampled
from openenv_harness.recorder.upstream.base import Upstream

if TYPE_CHECKING:
    from openenv_harness.recorder.validate import Evidence


class FullHistory:
    name = "full_history"
    uses_engine_facts = False

    async def sample(self, call: ModeCall, upstream: Upstream) -> Sampled:
        return Sampled(await upstream.chat(call.upstream_body, session_id=call.session_id, affinity=call.affinity))

    def report(self, call: ModeCall | None) -> dict[str, Any] | None:
        return None

    def committed(self, call: ModeCall, evidence: Evidence, agent_reply: dict[str, Any]) -> None:
        return None
