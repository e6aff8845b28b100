"""Step: the recorded chat completion, in the agent's own API, built only after the record committed."""

from __future__ import annotations

from starlette.responses import Response

from openenv_harness.recorder.call.flow import Flow


def reply(flow: Flow) -> Response:
    assert flow.agent_reply is not None
    return flow.dialect.render(flow.agent_reply, flow.dialect_call, flow.session.dialect_memory, stream=flow.wants_stream,
                               include_usage=flow.include_usage)
