"""``full_history`` (the default): the agent's messages, rendered in full by the engine each turn.

Replay drift (the agent re-spelling what the model said) is detected afterwards, by the record
step's fidelity tracking; the mode itself keeps nothing between calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from openenv_harness.recorder.prompt_modes.base import Sampled
from openenv_harness.recorder.upstream.base import Upstream

if TYPE_CHECKING:
    from openenv_harness.recorder.call.flow import Flow


class FullHistory:
    name = "full_history"

    async def sample(self, flow: Flow, upstream: Upstream) -> Sampled:
        reply = await upstream.chat(flow.upstream_body, session_id=flow.session.id, affinity=flow.session.affinity_key)
        return Sampled(reply)

    def report(self, flow: Flow) -> dict[str, Any] | None:
        return None

    def committed(self, flow: Flow) -> None:
        return None
