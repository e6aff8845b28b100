"""A prompt mode: how the forward step asks the engine for a session's sample.

Why a protocol: the mode is one step's strategy (``call/forward.py`` samples through it, the record
step commits through it and asks it what the record says of it); the steps never branch on which
mode a session runs. A mode sees a call as a ``ModeCall`` -- the request, its own state, the engine's
facts -- never the flow, the session or the recorder: what it may change is its state and the
call's ``report``. A mode returns what it sampled explicitly (``Sampled``), and says how it served a
call in ``ModeCall.report`` as soon as it knows -- so a call that fails part-way is recorded with the
step of the mode it failed at.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from openenv_harness.recorder.upstream.base import Upstream, UpstreamReply

if TYPE_CHECKING:
    from openenv_harness.recorder.prompt_modes.engine_facts import EngineFacts
    from openenv_harness.recorder.prompt_modes.state import ContinuationCall, IncrementalState
    from openenv_harness.recorder.validate import Evidence


@dataclass
class ModeCall:
    """One call as a prompt mode sees it (built by ``call/forward.py``)."""

    #: the agent's chat body, and what the engine is asked (the body plus the capture fields)
    body: dict[str, Any]
    upstream_body: dict[str, Any]
    call_kind: str
    #: what the engine's router keys the session on
    session_id: str
    affinity: str | None
    #: the session refuses an uncertain continuation instead of falling back (``prompt_mode_strict``)
    strict: bool
    #: what the mode keeps between the session's calls (``LiveSession.prompt_mode_state``)
    state: IncrementalState
    #: what the recorder learned of the engine that serves the session (``engine_facts.py``), and the
    #: certified turn ending (end-of-turn id, then the trailer; empty when uncertified): given only to
    #: a mode that ``uses_engine_facts``
    facts: EngineFacts | None
    turn_end: list[int]
    #: how the mode served the call: continued or fell back, and why (``metadata.prompt_mode``)
    report: dict[str, Any] | None = None
    #: what the incremental mode worked out in flight, which its commit reuses
    continuation: ContinuationCall | None = None


@dataclass
class Sampled:
    """A mode's sample: the engine's reply (in the chat route's shape) and, where the mode composed
    the prompt itself, its ids (checked ints: the record takes them as they are); None: the prompt
    ids are the ones the reply reports."""

    reply: UpstreamReply
    prompt_ids: array[int] | None = None


class PromptMode(Protocol):
    #: the session spec's ``prompt_mode`` value
    name: str
    #: the mode reads ``ModeCall.facts`` and ``turn_end`` (a mode that only relays the body does not)
    uses_engine_facts: bool

    async def sample(self, call: ModeCall, upstream: Upstream) -> Sampled:
        """Ask the engine for this call's sample."""

    def report(self, call: ModeCall | None) -> dict[str, Any] | None:
        """What an ``ok`` or ``invalid`` record says of the mode (``metadata.prompt_mode``); None: nothing.
        ``call`` is None for a call that never reached the engine."""

    def committed(self, call: ModeCall, evidence: Evidence, agent_reply: dict[str, Any]) -> None:
        """After the call's record is durable (its number known), for a call the agent is answered."""
