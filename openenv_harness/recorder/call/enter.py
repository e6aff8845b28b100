"""Step: the agent's request becomes the chat request the steps run on, through its dialect."""

from __future__ import annotations

from openenv_harness.recorder.call.flow import Flow


def enter(flow: Flow) -> None:
    entered = flow.dialect.enter(flow.raw, flow.session.dialect_memory)
    flow.body, flow.raw, flow.dialect_call = entered.body, entered.raw, entered.call
