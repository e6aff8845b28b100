"""How far the indexer may fall behind the journal before appends wait: in bytes and in records.

Why bytes: every journal frame holds a whole prompt and request, while SQLite keeps only a
record's new ids (``deltas.py``: prompts are deltas). So the unindexed backlog is what puts the
store's disk footprint above its content: a bound of 64 records alone let 64 frames of 60k-id
prompts (~45 MB) sit in the journal while a starved index process caught up -- more than the
content of a long run's first minutes. With the byte bound the journal's unindexed frames stay
within it (or one frame, when a single frame is larger), whatever the prompt length and however
many agents append at once.

How: an append *reserves* its frame's bytes before it is journalled, and waits (first come, first
served) while the reservation does not fit; the indexer's progress frees bytes and lets the next
waiters in. Durability before reply is untouched: the reply still follows the journal write,
which now may follow a wait. The record bound is kept as it was -- checked after the write (the
record durable, only its reply waiting) -- since a record count costs no disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

#: Unindexed journal bytes past which appends wait for the indexer (``AppendBacklog``): about 25
#: frames of 64k-id prompts (~0.6 MB each). Measured at 64 busy sessions of 8k-19k ids (frames of
#: 0.1-0.25 MB), 8 MiB cost the agents 18-32 % of their calls/s against no byte bound (the record
#: bound, 64, binds first there at 16 MiB); ``docs/benchmarks.md``, "Steady-state footprint".
MAX_BACKLOG_BYTES = 16 << 20


class _Waiter:
    __slots__ = ("fut", "loop", "nbytes")

    def __init__(self, loop: asyncio.AbstractEventLoop, fut: asyncio.Future[None], nbytes: int) -> None:
        self.loop, self.fut, self.nbytes = loop, fut, nbytes


class AppendBacklog:
    """Journal bytes reserved and not yet indexed, records not yet indexed, and who waits on them.

    Called from the event loop(s) and the indexer's thread; one lock covers the counts and the
    waiters, so a wake-up is never missed between a check and a registration.
    """

    def __init__(self, *, max_records: int, max_bytes: int, records: Callable[[], int]) -> None:
        if max_bytes <= 0 or max_records <= 0:
            raise ValueError("backlog bounds must be positive")
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._records = records
        self._lock = threading.Lock()
        self._bytes = 0
        self._byte_waiters: list[_Waiter] = []  # in arrival order
        self._record_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def bytes(self) -> int:
        return self._bytes

    def waiting(self) -> int:
        with self._lock:
            return len(self._byte_waiters) + len(self._record_waiters)

    def over(self) -> bool:
        """Someone waits or would (read without the lock: a hint for the indexer's priority)."""
        return bool(self._byte_waiters) or self._bytes > self.max_bytes or self._records() > self.max_records

    # -- bytes: reserved before the journal write ------------------------------------------------

    def reserve(self, nbytes: int) -> asyncio.Future[None] | None:
        """Take ``nbytes`` of the bound for a frame about to be journalled: None when taken now, else
        a future resolved once they are (``release`` them if the frame is then not written)."""
        with self._lock:
            if not self._byte_waiters and self._fits(nbytes):
                self._bytes += nbytes
                return None
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            self._byte_waiters.append(_Waiter(loop, fut, nbytes))
            return fut

    def add(self, nbytes: int) -> None:
        """Count a frame journalled without a reservation (sent again to a new index process)."""
        with self._lock:
            self._bytes += nbytes

    def release(self, nbytes: int) -> None:
        """A frame is indexed (or failed: it stays journalled for the next open, and must not hold
        every later call back), or a reserved frame was never written: its bytes are free."""
        with self._lock:
            self._bytes = max(0, self._bytes - nbytes)
            admitted = self._admit_locked()
        _resolve_all(admitted)

    def set_max_bytes(self, max_bytes: int) -> None:
        """Move the byte bound (``disk_budget.py`` grows it with the database); appends that now fit
        are let in at once."""
        if max_bytes <= 0:
            raise ValueError("backlog bounds must be positive")
        with self._lock:
            if max_bytes == self.max_bytes:
                return
            self.max_bytes = max_bytes
            admitted = self._admit_locked()
        _resolve_all(admitted)

    def _fits(self, nbytes: int) -> bool:
        return self._bytes == 0 or self._bytes + nbytes <= self.max_bytes  # a lone oversized frame goes in

    def _admit_locked(self) -> list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]:
        admitted = []
        while self._byte_waiters and self._fits(self._byte_waiters[0].nbytes):
            waiter = self._byte_waiters.pop(0)
            self._bytes += waiter.nbytes
            admitted.append((waiter.loop, waiter.fut))
        return admitted

    # -- records: checked after the journal write ------------------------------------------------

    def hold(self) -> asyncio.Future[None] | None:
        """A future resolved once the record backlog is within its bound again, or None if it is now."""
        with self._lock:
            if self._records() <= self.max_records:
                return None
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            self._record_waiters.append((loop, fut))
            return fut

    def wake(self, *, always: bool = False) -> None:
        """After indexer progress: release the record waiters if within bounds. ``always`` (the store
        closes) releases every waiter, byte waiters too (their write then fails on the closed journal)."""
        with self._lock:
            waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
            if self._record_waiters and (always or self._records() <= self.max_records):
                waiters, self._record_waiters = self._record_waiters, []
            if always:
                for waiter in self._byte_waiters:
                    self._bytes += waiter.nbytes
                    waiters.append((waiter.loop, waiter.fut))
                self._byte_waiters = []
        _resolve_all(waiters)


def _resolve_all(waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]) -> None:
    for loop, fut in waiters:
        with contextlib.suppress(RuntimeError):  # that event loop is closed: nobody is waiting any more
            loop.call_soon_threadsafe(_release, fut)


def _release(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_result(None)
