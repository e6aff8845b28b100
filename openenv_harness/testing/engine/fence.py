"""The weight-sync fence: vLLM's dev-mode ``/pause`` and ``/resume`` semantics, on a CPU.

Why it matters: a trainer pauses the engine around every weight update, and the recorder must
behave correctly for a call that is in flight across that pause. vLLM offers three modes:

- ``abort``: in-flight requests end now with ``finish_reason: "abort"`` (their tokens so far are
  returned); new requests are held until resume.
- ``wait``: new requests are held; ``/pause`` returns once the in-flight ones have finished.
- ``keep``: nothing errors; in-flight requests simply stop advancing, and new ones are held,
  until ``/resume``. One completion can therefore straddle a weight update.

vLLM 0.33 and later (``reject_new``) no longer hold new requests in ``abort`` and ``wait`` mode:
from the pause until ``/resume`` each is refused at once with a retryable 503 (``EnginePaused``:
``Generation is paused. Please retry after it resumes.``); ``keep`` still queues them.

A request is *in flight* from admission to its last token; the engine's per-token
``decode_delay_s`` gives tests a window to pause in.
"""

from __future__ import annotations

import asyncio
from typing import Literal, get_args

PauseMode = Literal["abort", "wait", "keep"]
PAUSE_MODES: tuple[str, ...] = get_args(PauseMode)


#: what vLLM 0.33 answers a request that arrives while it is paused in abort or wait mode
PAUSED_MESSAGE = "Generation is paused. Please retry after it resumes."


class EnginePaused(Exception):
    """A new request refused by an engine paused with vLLM 0.33's semantics (HTTP 503)."""

    def __init__(self) -> None:
        super().__init__(PAUSED_MESSAGE)


class Generation:
    """One admitted request's handle: the fence aborts it through here."""

    def __init__(self) -> None:
        self.aborted = False
        self._abort = asyncio.Event()

    def abort(self) -> None:
        self.aborted = True
        self._abort.set()

    async def wait_aborted(self, timeout_s: float) -> None:
        """Sleep ``timeout_s`` unless aborted first."""
        try:
            await asyncio.wait_for(self._abort.wait(), timeout_s)
        except TimeoutError:
            pass


class Fence:
    """Admission and decode gates shared by every request of one engine."""

    def __init__(self, *, reject_new: bool = False) -> None:
        #: vLLM 0.33+: new requests during an abort or wait pause are refused, not held
        self.reject_new = reject_new
        self._refusing = False
        self._paused = False
        self._admit = asyncio.Event()
        self._admit.set()
        self._decode = asyncio.Event()
        self._decode.set()
        self._drained = asyncio.Event()
        self._drained.set()
        self._running: set[Generation] = set()

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def in_flight(self) -> int:
        return len(self._running)

    async def admit(self) -> Generation:
        """Wait until the engine is not paused, then count the request as in flight; raise
        ``EnginePaused`` instead where this engine refuses new requests while paused."""
        if self._refusing:
            raise EnginePaused()
        while not self._admit.is_set():
            await self._admit.wait()
        generation = Generation()
        self._running.add(generation)
        self._drained.clear()
        return generation

    def release(self, generation: Generation) -> None:
        self._running.discard(generation)
        if not self._running:
            self._drained.set()

    async def step(self, generation: Generation, delay_s: float) -> bool:
        """Produce the next token's time slot; ``False`` means the request was aborted."""
        if delay_s > 0:
            await generation.wait_aborted(delay_s)
        while not self._decode.is_set() and not generation.aborted:
            waiter = asyncio.ensure_future(self._decode.wait())
            aborter = asyncio.ensure_future(generation.wait_aborted(3600.0))
            _, pending = await asyncio.wait({waiter, aborter}, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
        return not generation.aborted

    async def pause(self, mode: str) -> None:
        """Pause with vLLM's semantics; raises ``ValueError`` for an unknown mode."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"mode must be one of {', '.join(PAUSE_MODES)}; got {mode!r}")
        self._paused = True
        self._admit.clear()
        self._refusing = self.reject_new and mode != "keep"
        if mode == "keep":
            self._decode.clear()
            return
        self._decode.set()  # only keep freezes decoding; wait and abort let in-flight requests end
        if mode == "abort":
            for generation in list(self._running):
                generation.abort()
        await self._drained.wait()

    def resume(self) -> None:
        self._paused = False
        self._refusing = False
        self._decode.set()
        self._admit.set()
