"""The recorder's side of writing: journal each record, hand it to the indexer, follow what it indexed.

Why an object of its own: this is what a reply waits on -- a journal write and a hand-off, on the
event loop -- and the one place that keeps the journal, the indexer's queue and SQLite in step: one
order for seqs, journal frames and queued operations (``_append_lock``), the records journalled and
not yet indexed (the journal keeps them until they are), the backlog's bounds (``backlog.py``), and
an index process that kept failing replaced with nothing lost (``recover``). It is built from the
journal and the backlog's bounds, and given a way to build an indexer when the store opens
(``start``); the indexer reports each transaction back through ``committed``. What the indexer runs
is ``index_ops.py``; the store (``sqlite.py``) holds one of these and forwards its writes to it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from openenv_harness.recorder.store.backlog import AppendBacklog
from openenv_harness.recorder.store.base import PendingRecord, SessionRow, SessionSealed
from openenv_harness.recorder.store.indexer import Done, Indexer, IndexerFactory, IndexerFailed
from openenv_harness.recorder.store.journal import Journal, encode_record, encode_session

#: logged under the store's name, whichever of its modules logs: one logger to configure for the store
log = logging.getLogger("openenv_harness.recorder.store.sqlite")


class JournalQueue:
    """Appends, session rows and barriers, journalled and queued in one order, and what of them is indexed."""

    def __init__(self, journal: Journal, *, max_backlog_records: int, max_backlog_bytes: int) -> None:
        self.journal = journal
        #: appends journalled and not yet indexed, in records and bytes; replies wait past its bounds
        self.backlog = AppendBacklog(max_records=max_backlog_records, max_bytes=max_backlog_bytes,
                                     records=self.queued)
        #: None until ``start``; replaced by ``recover``
        self.indexer: Indexer | None = None
        self._make_indexer: IndexerFactory | None = None
        self._closed = False
        self._append_lock = threading.Lock()
        #: closed sessions: their appends are refused (``seal``)
        self._sealed: set[str] = set()
        self._next_seq = 1
        #: every record with a lower seq is in SQLite, except ``_unindexed`` (kept in the journal)
        self._indexed_through = 0
        #: per seq: ("append", where it lies in the journal, or None) or ("session", the row), for ``recover``
        self._unindexed: dict[int, tuple[str, Any]] = {}
        #: appends the indexer committed since the store opened
        self.records_written = 0

    def start(self, next_seq: int, make_indexer: IndexerFactory) -> None:
        """Journal from ``next_seq`` on (every lower seq is in SQLite) and start an indexer built by
        ``make_indexer``, which also builds its replacement in ``recover``."""
        self._next_seq = next_seq
        self._indexed_through = next_seq - 1
        self._make_indexer = make_indexer
        self.indexer = make_indexer(self.committed)
        self.indexer.start()

    def close(self, timeout_s: float) -> bool:
        """Refuse operations from now on, and stop the indexer once it has run what it was given.
        True when the journal holds nothing SQLite lacks (it can go)."""
        self._closed = True
        if self.indexer is None:
            return False
        finished = self.indexer.stop(timeout_s=timeout_s)
        self.backlog.wake(always=True)  # whatever is left is in the journal: nobody waits on a closed store
        return finished and not self._unindexed

    def failure(self) -> str | None:
        """Why no record can be taken now, or None (``RecordStore.failure``)."""
        if self._closed or self.indexer is None:
            return "the store is closed"
        return self.indexer.failed

    def queued(self) -> int:
        """Appends handed to the indexer and not yet acknowledged."""
        indexer = self.indexer
        return indexer.backlog() if indexer is not None else 0

    def journal_backlog(self) -> int:
        """Records and session rows journalled and not yet indexed."""
        return max(0, self._next_seq - 1 - self._indexed_through)

    def unindexed(self) -> int:
        """Operations the indexer failed: the journal keeps them for ``recover`` or the next open."""
        return len(self._unindexed)

    async def _submit(self, name: str, arg: Any) -> Any:
        if self._closed or self.indexer is None:
            raise RuntimeError("store is closed")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.indexer.submit((name, arg, fut, loop))
        # shield: a cancelled caller (agent hung up) must not un-write a record
        return await asyncio.shield(fut)

    async def append(self, record: PendingRecord) -> int:
        """Journal the record (durable when this returns) and hand it to the indexer.

        Two bounds on the indexer's lag (``backlog.py``). Bytes: the frame is journalled only once
        the unindexed journal has room for it (``max_backlog_bytes``), first come first served, so
        the journal on disk stays near that bound. Records: when the indexer is behind by more than
        ``MAX_BACKLOG`` (``indexer.py``), the call waits after journalling until it is back within
        that -- the next acknowledgement that brings the backlog down, not this record's own
        commit: under overload every call is slowed a little, in arrival order, instead of a few
        calls each waiting for the whole backlog ahead of them. Either way the reply follows the
        journal write.
        """
        if self._closed or self.indexer is None:
            raise RuntimeError("store is closed")
        parts = encode_record(record)
        nbytes = sum(len(p) for p in parts)  # the frame's payload, as ``Journal.append`` reports it
        room = self.backlog.reserve(nbytes)
        if room is not None:
            self.indexer.hurry()
            try:
                await asyncio.shield(room)
            except asyncio.CancelledError:  # the caller went: whenever the room comes, give it back
                room.add_done_callback(lambda _: self.backlog.release(nbytes))
                raise
        try:
            seq = await self._journal(record, parts, "append")
        except Exception:
            self.backlog.release(nbytes)  # not written: nothing of it waits for the indexer
            raise
        drained = self.backlog.hold()
        if drained is not None:
            self.indexer.hurry()
            await asyncio.shield(drained)
        return seq

    async def _journal(self, item: PendingRecord | SessionRow, parts: list[bytes], name: str) -> int:
        if self.journal.fsync:  # an fsync takes milliseconds: not on the event loop
            return await asyncio.to_thread(self._journal_and_queue, item, parts, name)
        return self._journal_and_queue(item, parts, name)  # a write to the page cache takes microseconds

    def _journal_and_queue(self, item: PendingRecord | SessionRow, parts: list[bytes], name: str = "append") -> int:
        assert self.indexer is not None
        with self._append_lock:  # seq order, journal order and queue order are one order
            if self.indexer.failed:  # refuse before journalling: the agent's retry must not be a twin
                raise IndexerFailed(self.indexer.failed)
            if name == "append" and item.session_id in self._sealed:  # a session row may follow its close
                raise SessionSealed(f"session {item.session_id} is closed: its records are final")
            seq = self._next_seq
            where = self.journal.append(seq, parts)
            self._next_seq = seq + 1
            arg = (seq, item, where) if name == "append" else (seq, item)
            self.indexer.submit((name, arg, None, None))
        return seq

    async def caught_up(self) -> None:
        """Return once every record appended so far is in SQLite (what readers wait for); at once
        when nothing was ever appended here (a queue never started: ``SQLiteStore.caught_up``)."""
        if self.indexer is None or self._closed:
            return
        await self._submit("nothing", None)

    def caught_up_sync(self, timeout_s: float = 60.0) -> None:
        """``caught_up`` for synchronous readers (blocks the calling thread)."""
        if self._closed or self.indexer is None or self.indexer.on_own_thread():
            return
        done = threading.Event()
        self.indexer.submit(("nothing", None, done, None))
        if not done.wait(timeout_s):
            raise TimeoutError(f"the store writer did not catch up in {timeout_s}s")

    def seal(self, session_id: str) -> None:
        """Under the append lock: an append journalling now finishes first, any later one is refused."""
        with self._append_lock:
            self._sealed.add(session_id)

    async def put_session(self, row: SessionRow) -> None:
        """Journal the row (durable when this returns) and hand it to the indexer, as ``append`` does.

        Why not wait for its commit: the indexer commits in submission order, so a session's create
        or close then waited behind every record queued before it -- 48-81 ms at 64 busy sessions, for
        a write that takes microseconds here. Not held back by the backlog either: a session row is
        tiny and creating sessions is how a trainer starts the work the backlog is made of.
        """
        if self._closed or self.indexer is None:
            raise RuntimeError("store is closed")
        await self._journal(row, encode_session(row), "session")

    async def forget(self, session_id: str) -> None:
        """Drop what the writer caches for a finished session (it only speeds up later appends).
        Queued behind the session's records, and not waited for: nothing depends on when it runs."""
        if self._closed or self.indexer is None:
            return
        self.indexer.submit(("forget", session_id, None, None))

    def committed(self, done: list[Done]) -> None:
        """After each indexer transaction, on the indexer's thread: advance the indexed mark, let
        the journal drop what SQLite now holds, wake whoever waits. ``done`` holds
        ``(name, argument, waiter, loop, value, error)`` per operation, in submission order."""
        for name, arg, _, _, _, error in done:
            if name in ("append", "session"):  # the journalled operations: (seq, ...)
                seq = arg[0]
                if error is not None:
                    # stays journalled: ``recover`` or the next open indexes it again
                    self._unindexed[seq] = (name, arg[2] if len(arg) > 2 else None) if name == "append" \
                        else (name, arg[1])
                else:
                    self._unindexed.pop(seq, None)  # a record ``recover`` sent again is indexed now
                    if name == "append":
                        self.records_written += 1
                if name == "append" and arg[2] is not None:
                    self.backlog.release(arg[2][2])  # finished with, either way (a failed one stays journalled)
                self._indexed_through = max(self._indexed_through, seq)
        floor = min(self._unindexed) - 1 if self._unindexed else self._indexed_through
        self.journal.release(floor)
        self.backlog.wake()
        for _, _, waiter, loop, value, error in done:
            if loop is not None:
                loop.call_soon_threadsafe(_resolve, waiter, value, error)
            elif waiter is not None:
                waiter.set()  # a synchronous caller's threading.Event

    async def recover(self) -> bool:
        """Replace an index process that kept dying, and send it every record left unindexed.

        Safe because nothing was lost: a failed store refuses appends before journalling them, and
        every record it acknowledged is in the journal, which stays open and locked by this process.
        The new index process skips what SQLite already has. If it keeps dying too (a record that
        crashes it, a disk that fails), the store fails again after the same number of restarts.
        """
        return await asyncio.to_thread(self._recover_indexer)

    def _recover_indexer(self) -> bool:
        with self._append_lock:  # no append is journalled while the indexer is replaced
            old = self.indexer
            if self._closed or old is None or old.failed is None:
                return False
            old.stop(timeout_s=10)  # its child is gone; this collects what it had not acknowledged
            again = sorted(self._unindexed.items())  # nothing else changes it now: no indexer runs
            lost = [seq for seq, (_, what) in again if what is None]
            if lost:  # not expected from a process indexer: every append it held says where it lies
                log.error("store: %d unindexed record(s) do not say where they lie; they are indexed at the "
                          "next open", len(lost))
            assert self._make_indexer is not None  # an indexer ran: ``start`` gave this
            new = self._make_indexer(self.committed)
            new.start()
            self.indexer = new
            for seq, (kind, what) in again:
                if what is None:
                    continue
                if kind == "append":
                    self.backlog.add(what[2])
                    new.submit(("append", (seq, None, what), None, None), resent=True)
                else:  # a session row: the latest state of the session, sent again as it was
                    new.submit(("session", (seq, what), None, None), resent=True)
        log.warning("store: index process replaced after it failed; %d record(s) sent to it again", len(again))
        return True


def _resolve(fut: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)
