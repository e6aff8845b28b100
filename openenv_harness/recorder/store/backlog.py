"""How far the indexer may fall behind the journal before appends wait: in records and in bytes.

Why both: every journal frame holds a whole prompt and request, while SQLite keeps only a record's
new ids (``sqlite.py``: prompts are deltas). So the unindexed backlog is what puts the store's disk
footprint above its content: a bound of 64 records alone let 64 frames of 60k-id prompts (~45 MB)
sit in the journal while a starved index process caught up -- more than the content of a long run's
first minutes. A byte bound keeps the journal on disk at about the bound plus two segments, at
every moment, whatever the prompt length.

What waits is the *reply*, never durability: an append is written to the journal first (durable
when the write returns) and only then, if the backlog is over either bound, waits until the
indexer has brought it back under both. Under overload every call is slowed a little, in arrival
order, instead of the disk growing with the indexer's lag.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

#: Unindexed journal bytes beyond which an append's reply waits for the indexer (``AppendBacklog``):
#: a few large-prompt records (a 64k-id frame is ~0.6 MB), far more than one batch at 8k ids.
MAX_BACKLOG_BYTES = 8 << 20


class AppendBacklog:
    """Appends journalled and not yet indexed, and the calls waiting for that to shrink.

    ``records`` counts them (the indexer's own count); bytes are counted here: ``add`` when a frame
    is journalled, ``done`` when the indexer has finished with it (committed, or failed -- a failed
    record stays in the journal for the next open, and must not hold every later call back).
    Called from the event loop and the indexer's thread; one lock covers the count and the waiters,
    so a wake-up is never missed between a check and a registration.
    """

    def __init__(self, *, max_records: int, max_bytes: int, records: Callable[[], int]) -> None:
        if max_bytes <= 0 or max_records <= 0:
            raise ValueError("backlog bounds must be positive")
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._records = records
        self._lock = threading.Lock()
        self._bytes = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []

    @property
    def bytes(self) -> int:
        return self._bytes

    def add(self, nbytes: int) -> None:
        with self._lock:
            self._bytes += nbytes

    def done(self, nbytes: int) -> None:
        with self._lock:
            self._bytes = max(0, self._bytes - nbytes)

    def over(self) -> bool:
        """Over either bound now (read without the lock: a hint for the indexer's priority)."""
        return self._bytes > self.max_bytes or self._records() > self.max_records

    def hold(self) -> asyncio.Future | None:
        """A future resolved once the backlog is within both bounds again, or None if it is now."""
        with self._lock:
            if not self.over():
                return None
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            self._waiters.append((loop, fut))
            return fut

    def wake(self, *, always: bool = False) -> None:
        """Release every waiter if the backlog is within bounds (or ``always``: the store closes)."""
        with self._lock:
            if not self._waiters or not (always or not self.over()):
                return
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_release, fut)
            except RuntimeError:
                pass  # that event loop is closed: nobody is waiting any more

    def waiting(self) -> int:
        with self._lock:
            return len(self._waiters)


def _release(fut: "asyncio.Future[Any]") -> None:
    if not fut.done():
        fut.set_result(None)
