"""One intercepted agent call, as plain data.

The flow is what passes through the call's named steps (``pipeline.py``); it imports none of the code
that processes it, so every step -- and a test -- can build one and run a step on it. Each field says
which step sets it; a field a step has not reached yet keeps its default.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from openenv_harness.recorder.dialects.dialect_call import DialectCall

if TYPE_CHECKING:  # what the fields hold; the flow runs none of it
    from openenv_harness.recorder.call.services import CallServices
    from openenv_harness.recorder.dialects.base import Dialect
    from openenv_harness.recorder.prompt_modes.base import ModeCall
    from openenv_harness.recorder.session.live import LiveSession
    from openenv_harness.recorder.upstream.base import UpstreamReply
    from openenv_harness.recorder.validate import Evidence


@dataclass
class Flow:
    #: what the steps may use of the recorder (``services.py``): never the session registry
    ctx: CallServices
    session: LiveSession
    headers: Mapping[str, str]
    #: the agent's API: it turns the request into the chat body at entry and the reply back at the end
    dialect: Dialect
    #: the request's bytes; after ``enter``, the chat body's (what is digested and stored)
    raw: bytes
    received_at: float = field(default_factory=time.time)
    started: float = field(default_factory=time.perf_counter)

    # -- enter, parse
    #: what the dialect's reply end needs from its request end (``enter``)
    dialect_call: DialectCall = field(default_factory=DialectCall)
    body: dict[str, Any] = field(default_factory=dict)
    wants_stream: bool = False
    include_usage: bool = False
    keep_logprobs: bool = False
    digest: str = ""
    call_kind: str = "agent"
    aux_rule: str | None = None

    # -- dedupe
    replayed: bool = False

    # -- forward
    upstream_body: dict[str, Any] = field(default_factory=dict)
    version_start: int = 0
    version_end: int = 0
    #: the engine was asked (the fence admitted the call): from here on a failure is recorded
    engine_asked: bool = False
    reply: UpstreamReply | None = None
    prompt_ids: array[int] | None = None
    #: the call as the session's prompt mode sees it; its ``report`` says how the mode served the call
    #: (continued or fell back, and why), set as soon as the mode knows, so a call failing part-way is
    #: recorded with it
    mode_call: ModeCall | None = None
    #: how long the call waited on an engine paused by someone else (``engine_paused.py``), if it did
    engine_paused: dict[str, Any] | None = None

    # -- validate, tool caps
    evidence: Evidence | None = None
    #: set when a tool-call cap cut the reply (``call/forward.py: apply_tool_caps``); kept in the record's metadata
    tool_limit: dict[str, Any] | None = None

    # -- record
    call_index: int = -1
    stored: bool = False
    #: the store refused the record (it is not durable): the call's number was given back
    store_refused: bool = False
    #: what the agent is sent (the recorded response; a replayed retry's, from its first sending)
    agent_reply: dict[str, Any] | None = None

    # -- an outcome a step sets and the pipeline applies
    #: the cap that stops the session (``enforce_budget``, ``tool_caps``): the pipeline stops it before
    #: the record is made or the refusal answered, so the record's ``limits.stop`` already names it
    stop: str | None = None

    # -- a close of the session while the call is served
    #: the task serving this call; a close may cancel it while ``cancellable`` (until the engine answered)
    task: asyncio.Task[Any] | None = None
    cancellable: bool = True
    cancelled_by_close: bool = False

    def cancel_for_close(self) -> None:
        """The session is closing and this call is still waiting (``SessionRegistry.close``)."""
        if self.cancellable and self.task is not None and not self.cancelled_by_close:
            self.cancelled_by_close = True
            self.task.cancel()
