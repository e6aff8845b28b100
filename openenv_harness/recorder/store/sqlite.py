"""The default store: one SQLite file in WAL mode, fed by a record journal and one indexer.

Why this shape:
- *Durable before reply* (D14): ``append`` writes the record to the journal (``journal.py``) and
  returns once that write has: a record is then safe against the process being killed
  (SIGKILL), as a WAL commit with ``synchronous=NORMAL`` would be; with ``synchronous=FULL`` the
  journal is fsync-ed too, so it also survives power loss. On open, every journalled record that
  SQLite lacks is indexed before anything is served.
- *Off the reply path*: deltas, compression and SQLite I/O run in the indexer -- a child process
  in the recorder, a thread in library use (``indexer.py``) -- after the reply has gone, so neither a
  commit nor a WAL checkpoint ever delays an agent.
- *Group commit*: everything queued while a commit was running goes into the next transaction,
  so throughput rises with concurrency instead of paying one commit per call. Reads first wait
  for the writer to catch up, so they always see every acknowledged record.
- *Linear growth*: a record stores its prompt as (an earlier record of the session, how many of its
  prompt tokens are shared, the new tokens), and its messages as a delta of content-addressed
  message hashes (``blocks.py``); reading a session resolves the chain of bases in one pass.

How it is put together: ``SQLiteStore`` implements ``RecordStore`` and holds its parts, each built
from the few pieces it uses and none of them knowing the store -- a ``JournalQueue``
(``journal_queue.py``: journals and queues writes, follows what the indexer committed), an
``IndexOps`` (``index_ops.py``: what the indexer runs, here for the store's start-up and a thread
indexer), the indexer itself, built by the queue from a factory this module binds
(``indexer.py``), and a ``Checkpointer`` (``checkpointer.py``). This module opens and closes the
file and answers reads; ``reads.py`` decodes rows; ``deltas.py`` is the delta format both sides
share; ``connection.py`` sets up every connection; ``schema.py`` holds the tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from openenv_harness.recorder.store import reads
from openenv_harness.recorder.store.backlog import MAX_BACKLOG_BYTES
from openenv_harness.recorder.store.base import PendingRecord, RecordStore, SessionRow
from openenv_harness.recorder.store.checkpointer import Checkpointer, file_size
from openenv_harness.recorder.store.connection import WAL_LIMIT_BYTES, connect
from openenv_harness.recorder.store.deltas import DeltaLists
from openenv_harness.recorder.store.disk_budget import DiskBudget
from openenv_harness.recorder.store.index_ops import IndexOps
from openenv_harness.recorder.store.index_priority import PRIORITIES
from openenv_harness.recorder.store.indexer import MAX_BACKLOG as _MAX_BACKLOG
from openenv_harness.recorder.store.indexer import make_indexer
from openenv_harness.recorder.store.journal import (
    SEGMENT_BYTES,
    Journal,
    decode_record,
    decode_session,
    journal_directory,
)
from openenv_harness.recorder.store.journal_queue import JournalQueue
from openenv_harness.recorder.store.read_gate import ReadGate
from openenv_harness.recorder.store.schema import SCHEMA

log = logging.getLogger(__name__)

#: Streamed reads (``iter_records``): records per page, resolved records kept as bases, blobs cached.
_STREAM_PAGE = 16
_STREAM_BASES = 8
_STREAM_BLOBS = 4096


class SQLiteStore(RecordStore):
    """SQLite-backed ``RecordStore``. ``path`` may be ``":memory:"``-like only via a temp file.

    ``indexer``: ``"thread"`` (default) or ``"process"`` -- where records are indexed into SQLite
    (``indexer.py``; the recorder uses a process). ``max_backlog_bytes``: unindexed journal bytes
    past which an append waits for the indexer before journalling (``backlog.py``). It,
    ``wal_limit_bytes`` and ``journal_segment_bytes`` are the most each bound may be: while the
    database is small they are a share of it (``disk_budget.py``).
    """

    def __init__(self, path: str | Path, *, synchronous: str = "NORMAL", indexer: str = "thread",
                 index_priority: str = "idle", wal_limit_bytes: int = WAL_LIMIT_BYTES,
                 journal_segment_bytes: int = SEGMENT_BYTES, max_backlog_bytes: int = MAX_BACKLOG_BYTES) -> None:
        if synchronous.upper() not in {"NORMAL", "FULL", "EXTRA"}:
            raise ValueError("synchronous must be NORMAL, FULL or EXTRA")
        if indexer not in {"thread", "process"}:
            raise ValueError(f"indexer must be 'thread' or 'process', not {indexer!r}")
        if index_priority not in PRIORITIES:
            raise ValueError(f"index_priority must be one of {PRIORITIES}, not {index_priority!r}")
        #: the index process's CPU priority (``index_priority.py``); a thread indexer's is the recorder's
        self.index_priority = index_priority
        self.path = str(path)
        self.synchronous = synchronous.upper()
        # another process cannot open this process's in-memory database
        self.indexer_kind = "thread" if self.path in {":memory:", ""} else indexer
        #: WAL size past which the checkpointer resets the log (``checkpointer.py``)
        self.wal_limit_bytes = wal_limit_bytes
        self._connect = functools.partial(connect, self.path, self.synchronous, wal_limit_bytes)
        self._wconn: sqlite3.Connection | None = None
        self._local = threading.local()
        #: readers pass it; a WAL reset that readers kept failing closes it for a moment (``read_gate.py``)
        self._read_gate = ReadGate()
        self._closed = False
        self.journal = Journal(journal_directory(self.path), fsync=self.synchronous != "NORMAL",
                               segment_bytes=journal_segment_bytes)
        #: the write side: journal, hand-off to the indexer, what is indexed (``journal_queue.py``)
        self._queue = JournalQueue(self.journal, max_backlog_records=_MAX_BACKLOG,
                                   max_backlog_bytes=max_backlog_bytes)
        #: appends journalled and not yet indexed, in records and bytes; replies wait past its bounds
        self.backlog = self._queue.backlog
        #: what an indexer runs; this one serves the start-up's recovery and a thread indexer
        self._index_ops = IndexOps()
        self._checkpointer: Checkpointer | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def open(self) -> None:
        try:
            home_loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            home_loop = None
        if self.path not in {":memory:", ""}:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = self._connect()
        conn.executescript(SCHEMA)
        # No automatic checkpoint on the writer: one would stall a commit (and every reply waiting on
        # it) for milliseconds. A separate thread checkpoints PASSIVE-ly, which never blocks writers.
        conn.execute("PRAGMA wal_autocheckpoint=0")
        self._wconn = conn
        try:
            next_seq = self._recover(conn)
        except BaseException:
            conn.close()
            self._wconn = None
            self.journal.close(remove=False)  # lets go of the journal's lock
            raise
        # the configured bounds are the most each may be; while the database is small they are less
        self.disk_budget = DiskBudget(self.wal_limit_bytes, self.backlog.max_bytes, self.journal.segment_bytes)
        self._follow_budget()
        # the indexer's parts, bound here: the queue builds it now, and again to replace a failed one
        self._queue.start(next_seq, functools.partial(
            make_indexer, self.indexer_kind, ops=self._index_ops, conn=conn, path=self.path,
            synchronous=self.synchronous, priority=self.index_priority, backlog=self.backlog,
            home_loop=home_loop))
        self._checkpointer = Checkpointer(self.path, self._connect, self._read_gate, self._follow_budget)
        self._checkpointer.start()

    def _recover(self, conn: sqlite3.Connection) -> int:
        """Index what the journal holds and SQLite lacks (a crash between reply and commit); returns
        the next seq, and the journal is open for it."""
        self.journal.acquire()
        recovered = 0
        last = int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM records").fetchone()[0])
        for seq, payload in self.journal.recover():
            last = max(last, seq)
            row = decode_session(payload)
            if row is not None:  # re-applied in journal order: the latest frame of a session wins
                results = self._index_ops.run_batch(conn, [("session", (seq, row))])
                if results[0][1] is not None:
                    raise RuntimeError(f"cannot index journalled session {row.session_id}: {results[0][1]}")
                continue
            if conn.execute("SELECT 1 FROM records WHERE seq = ?", (seq,)).fetchone() is not None:
                continue
            results = self._index_ops.run_batch(conn, [("append", (seq, decode_record(payload)))])
            if results[0][1] is not None:
                raise RuntimeError(f"cannot index journalled record {seq}: {results[0][1]}") from results[0][1]
            recovered += 1
        if recovered:
            log.warning("store: indexed %d record(s) from the journal after an unclean stop", recovered)
        self.journal.start(last + 1)
        return last + 1

    def _follow_budget(self) -> int:
        """Set the journal's and the backlog's bounds for the database's size now; returns the WAL's."""
        bounds = self.disk_budget.at(file_size(Path(self.path)))
        self.journal.segment_bytes = bounds.segment_bytes  # read at the next append (rotation)
        self.backlog.set_max_bytes(bounds.backlog_bytes)
        return bounds.wal_bytes

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        clean = self._queue.close(timeout_s=30)  # the indexer finishes what it was given first
        if self._checkpointer is not None:
            self._checkpointer.stop(timeout_s=30)
        # every record reached SQLite unless the indexer failed one (or none ran): then the journal keeps it
        self.journal.close(remove=clean)
        if self._wconn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._wconn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._wconn.close()

    # -- writes: the journal queue's -------------------------------------------------------------

    async def append(self, record: PendingRecord) -> int:
        """Durable when this returns: journalled, and handed to the indexer (``JournalQueue.append``)."""
        return await self._queue.append(record)

    async def put_session(self, row: SessionRow) -> None:
        await self._queue.put_session(row)

    async def forget(self, session_id: str) -> None:
        await self._queue.forget(session_id)

    def seal(self, session_id: str) -> None:
        self._queue.seal(session_id)

    async def caught_up(self) -> None:
        """Return once every record appended so far is in SQLite (what readers wait for).

        A store that was never opened is a reader of someone else's file (``trace --store``):
        there is nothing of ours to wait for. Records a crashed recorder left in its journal
        appear once a recorder opens the store again.
        """
        await self._queue.caught_up()

    def caught_up_sync(self, timeout_s: float = 60.0) -> None:
        """``caught_up`` for synchronous readers (blocks the calling thread)."""
        self._queue.caught_up_sync(timeout_s)

    def failure(self) -> str | None:
        return self._queue.failure()

    async def recover(self) -> bool:
        """Replace an index process that kept dying, with nothing lost (``JournalQueue.recover``)."""
        return await self._queue.recover()

    # -- reads -----------------------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
        return conn

    def load_sessions(self) -> list[SessionRow]:
        self.caught_up_sync()
        with self._read_gate.reading():
            return reads.load_sessions(self._reader())

    async def read_records(self, session_id: str, *, after_seq: int = 0) -> list[dict[str, Any]]:
        await self.caught_up()
        return await asyncio.to_thread(self._read_records, session_id, after_seq)

    def _read_records(self, session_id: str, after_seq: int, digest: str | None = None) -> list[dict[str, Any]]:
        with self._read_gate.reading():
            return reads.read_records(self._reader(), session_id, after_seq, digest)

    def iter_records(self, session_id: str, *, after_seq: int = 0) -> Iterator[dict[str, Any]]:
        """A session's records one at a time, for exports that stream them (the admin API's reads).

        Why: a long session's records read whole are tens of megabytes of JSON and several times
        that in Python objects (a list of ints per prompt), and memory freed in pieces that large
        does not all go back to the system: resident memory stayed 30-65 MB above its level after
        one such read. Here only one record is built at a time, and only the last few records'
        resolved prompts are kept as bases for the next. Records are read in pages, each in its own
        short transaction: a reader holding one snapshot through a slow download would keep the WAL
        from being reset all that time. Synchronous and on its own connection (any thread may drive
        it); call ``caught_up`` first to see every acknowledged record.
        """
        conn = self._connect()
        try:
            lists = DeltaLists(conn, keep=_STREAM_BASES)
            cache: dict[bytes, bytes] = {}
            sql = f"SELECT {reads.COLUMNS} FROM records WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?"
            last = after_seq
            while True:
                with self._read_gate.reading():  # a page at a time: the gate is never held across a yield
                    rows = conn.execute(sql, (session_id, last, _STREAM_PAGE)).fetchall()
                    page = [reads.decode_row(conn, row, cache, lists) for row in rows]
                for row, record in zip(rows, page, strict=True):
                    yield record
                    last = row[0]
                if len(rows) < _STREAM_PAGE:
                    return
                if len(cache) > _STREAM_BLOBS:
                    cache.clear()
        finally:
            conn.close()

    async def find_by_digest(self, session_id: str, request_digest: str) -> dict[str, Any] | None:
        await self.caught_up()
        rows = await asyncio.to_thread(self._read_records, session_id, 0, request_digest)
        return rows[-1] if rows else None

    def stats(self) -> dict[str, Any]:
        conn = self._reader()
        page_count = conn.execute("PRAGMA page_count").fetchone()[0]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        wal = Path(self.path + "-wal")
        return {
            "records_written": self._queue.records_written,
            "db_bytes": page_count * page_size,
            "wal_bytes": wal.stat().st_size if wal.exists() else 0,
            "queue_depth": self._queue.queued(),
            "journal_backlog": self._queue.journal_backlog(),
            "journal_unindexed": self._queue.unindexed(),
            "journal_backlog_bytes": self.backlog.bytes,
            "failure": self.failure(),
        }

    def session_bytes(self, session_id: str) -> dict[str, int]:
        """Bytes a session occupies (its rows plus every blob it references), for benchmarks."""
        self.caught_up_sync()
        return reads.session_bytes(self._reader(), session_id)
