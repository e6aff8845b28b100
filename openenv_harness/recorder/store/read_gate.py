"""A gate the store's readers pass, which a WAL reset can close for the moment it needs.

Why: SQLite resets (truncates) its write-ahead log only when no reader is on a snapshot inside
it. Readers that follow one another without a pause -- an exporter paging through a long session,
a trainer polling records -- can keep one snapshot or another open at every instant, so a
TRUNCATE checkpoint that waits a bounded time for them fails tick after tick and the WAL grows with
everything written (measured: 8-12 MB against a 1 MiB bound, with one thread reading in a loop).
Readers of this process therefore take the gate (shared, cheap) around each read transaction; a
reset takes it alone: new readers wait while it runs (up to a few hundred milliseconds on a busy
machine: it copies what is left of a log of a few MB and syncs the file), readers already inside
finish first. Resets happen only while the log is past its bound, a few times a second at most. The recorder's reply path never reads through it (records are durable on the journal), so
no agent waits on a reset.

Reentrant per thread: a read that calls another read inside the gate is not held back by a reset
waiting for it to finish (that would deadlock).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ReadGate:
    """Shared entry for readers; exclusive, bounded entry for a WAL reset."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._closed = False
        self._depth = threading.local()

    @contextmanager
    def reading(self) -> Iterator[None]:
        depth = getattr(self._depth, "n", 0)
        if depth == 0:
            with self._cond:
                while self._closed:
                    self._cond.wait()
                self._readers += 1
        self._depth.n = depth + 1
        try:
            yield
        finally:
            self._depth.n = depth
            if depth == 0:
                with self._cond:
                    self._readers -= 1
                    if self._readers == 0:
                        self._cond.notify_all()

    @contextmanager
    def alone(self, timeout_s: float) -> Iterator[bool]:
        """Close the gate to new readers and wait up to ``timeout_s`` for those inside to leave.
        Yields whether none is left (the caller goes on either way: a read that outlasts the
        wait is left alone, and SQLite's own busy timeout then decides)."""
        with self._cond:
            self._closed = True
            emptied = self._cond.wait_for(lambda: self._readers == 0, timeout_s)
        try:
            yield emptied
        finally:
            with self._cond:
                self._closed = False
                self._cond.notify_all()

    @property
    def readers(self) -> int:
        with self._cond:
            return self._readers
