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

Where each part lives: this module opens and closes the file and answers reads; ``checkpointer.py``
copies the WAL back into the database;
``journal_queue.py`` journals and queues writes and follows what the indexer committed;
``index_ops.py`` is what the indexer runs; ``reads.py`` decodes rows; ``deltas.py`` is the delta
format both sides share; ``schema.py`` the tables.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator

from openenv_harness.recorder.store import reads
from openenv_harness.recorder.store.backlog import MAX_BACKLOG_BYTES, AppendBacklog
from openenv_harness.recorder.store.checkpointer import Checkpointer, file_size
from openenv_harness.recorder.store.connection import WAL_LIMIT_BYTES, connect
from openenv_harness.recorder.store.deltas import DeltaLists, SessionTail
from openenv_harness.recorder.store.disk_budget import DiskBudget
from openenv_harness.recorder.store.read_gate import ReadGate
from openenv_harness.recorder.store.base import RecordStore, SessionRow
from openenv_harness.recorder.store.index_ops import IndexOps
from openenv_harness.recorder.store.index_priority import PRIORITIES
from openenv_harness.recorder.store.indexer import MAX_BACKLOG as _MAX_BACKLOG
from openenv_harness.recorder.store.indexer import ProcessIndexer, ThreadIndexer, make_indexer
from openenv_harness.recorder.store.journal import (SEGMENT_BYTES, Journal, decode_record, decode_session,
                                                    journal_directory)
from openenv_harness.recorder.store.journal_queue import JournalQueue
from openenv_harness.recorder.store.schema import SCHEMA

log = logging.getLogger(__name__)

#: Streamed reads (``iter_records``): records per page, resolved records kept as bases, blobs cached.
_STREAM_PAGE = 16
_STREAM_BASES = 8
_STREAM_BLOBS = 4096


class SQLiteStore(JournalQueue, IndexOps, RecordStore):
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
        self._indexer: ThreadIndexer | ProcessIndexer | None = None
        self._wconn: sqlite3.Connection | None = None
        self._local = threading.local()
        #: readers pass it; a WAL reset that readers kept failing closes it for a moment (``read_gate.py``)
        self._read_gate = ReadGate()
        # session id -> what its latest record stored (delta base for the next one; a cache, not state)
        self._recent: OrderedDict[str, SessionTail] = OrderedDict()
        self._records_written = 0
        self._closed = False
        self._checkpointer: Checkpointer | None = None
        #: the event loop that opened the store (the recorder's chat loop): the indexer defers its sends
        #: to a turn of that loop only; another thread's loop (the admin listener) sends at once
        self.home_loop: asyncio.AbstractEventLoop | None = None
        #: WAL size past which the checkpointer resets the log (``checkpointer.py``)
        self.wal_limit_bytes = wal_limit_bytes
        self.journal = Journal(journal_directory(self.path), fsync=self.synchronous != "NORMAL",
                               segment_bytes=journal_segment_bytes)
        self._append_lock = threading.Lock()
        #: closed sessions: their appends are refused (``seal``)
        self._sealed: set[str] = set()
        self._next_seq = 1
        #: every record with a lower seq is in SQLite, except ``_unindexed`` (kept in the journal):
        #: seq -> where its frame lies in the journal (None when not known), until it is indexed
        self._indexed_through = 0
        #: per seq: ("append", where it lies in the journal) or ("session", the row), for ``recover``
        self._unindexed: dict[int, tuple[str, Any]] = {}
        #: appends journalled and not yet indexed, in records and bytes; replies wait past its bounds
        self.backlog = AppendBacklog(max_records=_MAX_BACKLOG, max_bytes=max_backlog_bytes,
                                     records=lambda: self._indexer.backlog() if self._indexer is not None else 0)

    # -- lifecycle -----------------------------------------------------------------------------

    def open(self) -> None:
        try:
            self.home_loop = asyncio.get_running_loop()
        except RuntimeError:
            self.home_loop = None
        if self.path not in {":memory:", ""}:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = self._connect()
        conn.executescript(SCHEMA)
        # No automatic checkpoint on the writer: one would stall a commit (and every reply waiting on
        # it) for milliseconds. A separate thread checkpoints PASSIVE-ly, which never blocks writers.
        conn.execute("PRAGMA wal_autocheckpoint=0")
        self._wconn = conn
        try:
            self._recover(conn)
        except BaseException:
            conn.close()
            self._wconn = None
            self.journal.close(remove=False)  # lets go of the journal's lock
            raise
        # the configured bounds are the most each may be; while the database is small they are less
        self.disk_budget = DiskBudget(self.wal_limit_bytes, self.backlog.max_bytes, self.journal.segment_bytes)
        self._follow_budget()
        self._indexer = make_indexer(self.indexer_kind, self)
        self._indexer.start()
        self._checkpointer = Checkpointer(self.path, self._connect, self._read_gate, self._follow_budget)
        self._checkpointer.start()

    def _recover(self, conn: sqlite3.Connection) -> None:
        """Index what the journal holds and SQLite lacks (a crash between reply and commit)."""
        self.journal.acquire()
        recovered = 0
        last = int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM records").fetchone()[0])
        for seq, payload in self.journal.recover():
            last = max(last, seq)
            row = decode_session(payload)
            if row is not None:  # re-applied in journal order: the latest frame of a session wins
                results = self._run_batch(conn, [("session", (seq, row))])
                if results[0][1] is not None:
                    raise RuntimeError(f"cannot index journalled session {row.session_id}: {results[0][1]}")
                continue
            if conn.execute("SELECT 1 FROM records WHERE seq = ?", (seq,)).fetchone() is not None:
                continue
            results = self._run_batch(conn, [("append", (seq, decode_record(payload)))])
            if results[0][1] is not None:
                raise RuntimeError(f"cannot index journalled record {seq}: {results[0][1]}") from results[0][1]
            recovered += 1
        if recovered:
            log.warning("store: indexed %d record(s) from the journal after an unclean stop", recovered)
        self._next_seq = last + 1
        self._indexed_through = last
        self.journal.start(self._next_seq)

    def _follow_budget(self) -> int:
        """Set the journal's and the backlog's bounds for the database's size now; returns the WAL's."""
        bounds = self.disk_budget.at(file_size(Path(self.path)))
        self.journal.segment_bytes = bounds.segment_bytes  # read at the next append (rotation)
        self.backlog.set_max_bytes(bounds.backlog_bytes)
        return bounds.wal_bytes

    def _connect(self) -> sqlite3.Connection:
        return connect(self.path, self.synchronous, self.wal_limit_bytes)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._indexer is not None:
            finished = self._indexer.stop(timeout_s=30)
            self.backlog.wake(always=True)  # whatever is left is in the journal: nobody waits on a closed store
            if self._checkpointer is not None:
                self._checkpointer.stop(timeout_s=30)
            # every record reached SQLite unless the indexer failed one: then the journal keeps it
            self.journal.close(remove=finished and not self._unindexed)
        if self._wconn is not None:
            try:
                self._wconn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass
            self._wconn.close()

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
                for row, record in zip(rows, page):
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

    def failure(self) -> str | None:
        if self._closed or self._indexer is None:
            return "the store is closed"
        return self._indexer.failed

    def stats(self) -> dict[str, Any]:
        conn = self._reader()
        page_count = conn.execute("PRAGMA page_count").fetchone()[0]
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        wal = Path(self.path + "-wal")
        return {
            "records_written": self._records_written,
            "db_bytes": page_count * page_size,
            "wal_bytes": wal.stat().st_size if wal.exists() else 0,
            "queue_depth": self._indexer.backlog() if self._indexer is not None else 0,
            "journal_backlog": max(0, self._next_seq - 1 - self._indexed_through),
            "journal_unindexed": len(self._unindexed),
            "journal_backlog_bytes": self.backlog.bytes,
            "failure": self.failure(),
        }

    def session_bytes(self, session_id: str) -> dict[str, int]:
        """Bytes a session occupies (its rows plus every blob it references), for benchmarks."""
        self.caught_up_sync()
        return reads.session_bytes(self._reader(), session_id)
