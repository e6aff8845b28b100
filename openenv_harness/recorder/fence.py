"""The weight-sync fence and the policy version (D12).

The trainer pauses the engine, swaps weights, resumes. The recorder must know which policy served
each call: it counts versions itself (bumped on every resume that goes through it, or set
explicitly by a trainer that fences the engine on its own) and stamps every record with the
version at the start and at the end of its call, so a call that straddled a sync is visible.
Calls that arrive while paused wait (bounded) instead of reaching a half-updated engine; past the
bound they get a retryable 503 -- never a torn generation.

The order of a resume is what keeps the end versions honest: the version is bumped *before* the
engine is told to resume (``advance``), and the fence opens only after the engine acknowledged. A
call kept across the sync can finish the moment the engine resumes, before its acknowledgement
arrives; bumped first, it ends at the new version (``straddled_sync``). Bumped after, it would end
at the old one although its last tokens came from the new weights. A call that ended before the
resume and is read after the bump is marked straddled too: a false alarm is safe, a missed
straddle is wrong training data. A resume the engine does not acknowledge leaves the fence closed
and the version advanced; the trainer's retry does not advance it again.
"""

from __future__ import annotations

import asyncio
import time


class Fence:
    """Pause state, policy version and in-flight accounting."""

    def __init__(self, *, wait_s: float = 30.0, initial_version: int = 0) -> None:
        self.version = initial_version
        self.wait_s = wait_s
        self.paused = False
        self.paused_at: float | None = None
        self.pause_mode: str | None = None
        self.inflight = 0
        #: the version was advanced for the resume under way (once per sync, however often it is retried)
        self._advanced = False
        self._resumed = asyncio.Event()
        self._resumed.set()
        self.pauses = 0
        #: model name to serve every call with (a LoRA sync publishes each version as a new adapter
        #: name, e.g. ``policy-v7``; the agent keeps asking for the name it was configured with)
        self.served_model: str | None = None

    def pause(self, mode: str | None = None) -> None:
        if not self.paused:
            self.paused = True
            self.paused_at = time.time()
            self.pause_mode = mode
            self.pauses += 1
            self._resumed.clear()

    def advance(self) -> int:
        """The version the engine serves once it resumes; call before resuming it. Idempotent until
        the fence opens (``resume``) or the version is set explicitly."""
        if not self._advanced:
            self.version += 1
            self._advanced = True
        return self.version

    def resume(self, *, bump: bool = True) -> int:
        """Open the fence; ``bump`` advances the version first unless that was done already."""
        if bump:
            self.advance()
        self._advanced = False
        self.paused = False
        self.paused_at = None
        self.pause_mode = None
        self._resumed.set()
        return self.version

    def set_version(self, version: int) -> None:
        """An explicit version (a trainer pinning its own count): a later resume bumps from it."""
        self.version = version
        self._advanced = False

    async def admit(self) -> bool:
        """Wait for the fence to open; False if it stayed closed for ``wait_s``."""
        if not self.paused:
            return True
        try:
            await asyncio.wait_for(self._resumed.wait(), timeout=self.wait_s)
        except TimeoutError:
            return False
        return True

    def state(self) -> dict[str, object]:
        return {
            "policy_version": self.version,
            "paused": self.paused,
            "paused_at": self.paused_at,
            "pause_mode": self.pause_mode,
            "inflight": self.inflight,
            "pauses": self.pauses,
            "wait_s": self.wait_s,
            "served_model": self.served_model,
        }
