"""A prompt mode: how the forward step asks the engine for a session's sample.

Why a protocol: the mode is one step's strategy (``call/forward.py`` samples through it,
``call/record.py`` commits through it and asks it what the record says of it); the steps never
branch on which mode a session runs. A mode returns what it sampled explicitly (``Sampled``), and
says how it served a call in ``Flow.prompt_mode`` as soon as it knows -- so a call that fails part-way
is recorded with the step of the mode it failed at.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from openenv_harness.recorder.upstream.base import Upstream, UpstreamReply

if TYPE_CHECKING:
    from openenv_harness.recorder.call.flow import Flow


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

    async def sample(self, flow: Flow, upstream: Upstream) -> Sampled:
        """Ask the engine for this call's sample."""

    def report(self, flow: Flow) -> dict[str, Any] | None:
        """What an ``ok`` or ``invalid`` record says of the mode (``metadata.prompt_mode``); None: nothing."""

    def committed(self, flow: Flow) -> None:
        """After the call's record is durable (its number known)."""
