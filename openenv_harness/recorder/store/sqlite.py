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
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from array import array
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator

import orjson

from openenv_harness.recorder.store import blocks
from openenv_harness.recorder.store.backlog import MAX_BACKLOG_BYTES, AppendBacklog
from openenv_harness.recorder.store.disk_budget import DiskBudget
from openenv_harness.recorder.store.read_gate import ReadGate
from openenv_harness.recorder.store.base import PendingRecord, RecordStore, SessionRow, SessionSealed
from openenv_harness.recorder.store.index_priority import PRIORITIES
from openenv_harness.recorder.store.indexer import MAX_BACKLOG as _MAX_BACKLOG
from openenv_harness.recorder.store.indexer import IndexerFailed, ProcessIndexer, ThreadIndexer, make_indexer
from openenv_harness.recorder.store.prompt_sketch import PromptSketch, block_digests
from openenv_harness.recorder.store.prompt_sketch import prompt_delta as _prompt_delta
from openenv_harness.recorder.store.journal import (SEGMENT_BYTES, Journal, decode_record, decode_session,
                                                    encode_record, encode_session)

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    secret_digest TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    closed_at REAL,
    stop_reason TEXT,
    spec BLOB NOT NULL,
    state BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS blobs (
    hash BLOB PRIMARY KEY,
    data BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    call_index INTEGER NOT NULL,
    call_kind TEXT NOT NULL,
    status TEXT NOT NULL,
    trainable INTEGER NOT NULL,
    request_digest TEXT NOT NULL,
    created_at REAL NOT NULL,
    prompt_len INTEGER NOT NULL,
    prompt_base INTEGER,
    prompt_shared INTEGER NOT NULL DEFAULT 0,
    prompt_tail BLOB,
    msgs_base INTEGER,
    msgs_shared INTEGER NOT NULL DEFAULT 0,
    msgs BLOB,
    completion_ids BLOB,
    logprobs BLOB,
    completion_tokens BLOB,
    request BLOB NOT NULL,
    response BLOB NOT NULL,
    metadata BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS records_by_session ON records(session_id, seq);
CREATE INDEX IF NOT EXISTS records_by_digest ON records(session_id, request_digest);
"""

_REF_MESSAGES = "$oeh_messages"
_REF_TOOLS = "$oeh_tools"
#: How many earlier prompts of a session are tried as the base of a new one.
_PROMPT_BASES = 2
#: How many sessions' "recently stored hashes" the writer remembers (a cache, not state).
_HASH_CACHE_SESSIONS = 512
#: The checkpointer copies the WAL into the database this often (seconds), off the writer thread.
_CHECKPOINT_EVERY_S = 0.25
#: WAL size past which a checkpoint resets the log (``_checkpoint_loop``): the store's disk footprint
#: is then its content, the journal's open segment and at most about this much more (less while the
#: database is small: ``disk_budget.py``).
WAL_LIMIT_BYTES = 8 << 20
#: How long a resetting checkpoint waits for readers (and holds the indexer back) before it retries later.
_CHECKPOINT_WAIT_MS = 200
#: How long a WAL reset waits, with new readers held back, for this process's readers inside to finish.
_RESET_READERS_WAIT_S = 1.0
#: Streamed reads (``iter_records``): records per page, resolved records kept as bases, blobs cached.
_STREAM_PAGE = 16
_STREAM_BASES = 8
_STREAM_BLOBS = 4096
#: What the indexer runs, by the name an operation travels under (to a child process too).
_OPS = {"append": "_op_append", "session": "_op_put_session", "forget": "_op_forget", "nothing": "_op_nothing"}


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
        self._indexer: ThreadIndexer | ProcessIndexer | None = None
        self._wconn: sqlite3.Connection | None = None
        self._local = threading.local()
        #: readers pass it; a WAL reset that readers kept failing closes it for a moment (``read_gate.py``)
        self._read_gate = ReadGate()
        # session id -> what its latest record stored (delta base for the next one; a cache, not state)
        self._recent: OrderedDict[str, _Tail] = OrderedDict()
        self._records_written = 0
        self._closed = False
        #: the event loop that opened the store (the recorder's chat loop): the indexer defers its sends
        #: to a turn of that loop only; another thread's loop (the admin listener) sends at once
        self.home_loop: asyncio.AbstractEventLoop | None = None
        #: WAL size past which the checkpointer resets the log (``_checkpoint_loop``)
        self.wal_limit_bytes = wal_limit_bytes
        self.journal = Journal(self.path + ".records-log", fsync=self.synchronous != "NORMAL",
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
        conn.executescript(_SCHEMA)
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
        self._stop_checkpoints = threading.Event()
        self._indexer = make_indexer(self.indexer_kind, self)
        self._indexer.start()
        self._checkpointer = threading.Thread(target=self._checkpoint_loop, name="oeh-store-checkpoint", daemon=True)
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

    def _checkpoint_loop(self) -> None:
        """Copy the WAL into the database a few times a second, and reset it once past its bound.

        A PASSIVE checkpoint never blocks anyone, but it cannot shrink the log: the file is reused
        from its start only when a writer finds every frame copied and no reader on it, which a
        writer that never pauses does not allow -- the WAL then grew with everything written until
        the recorder stopped (15x the records' bytes in a long run). So past ``wal_limit_bytes`` the
        checkpoint is a TRUNCATE: it holds the indexer's next transaction back while it copies what
        is left (off the reply path: agents wait only on the journal) and empties the file. It waits
        for readers on older snapshots at most ``_CHECKPOINT_WAIT_MS``; if one is still reading, the
        copy done so far stays and the reset is tried again at once, then on the next tick. This
        process's new readers are held back while it runs (``read_gate.py``): readers that follow one
        another without a pause defeated it tick after tick. The bounds (this one,
        the journal's segment and its byte backlog) follow the database's size (``disk_budget.py``),
        read here on every tick.
        """
        conn = self._connect()
        conn.execute(f"PRAGMA busy_timeout={_CHECKPOINT_WAIT_MS}")
        wal = Path(self.path + "-wal")
        try:
            while not self._stop_checkpoints.wait(_CHECKPOINT_EVERY_S):
                try:
                    if _file_size(wal) > self._follow_budget():
                        self._reset_wal(conn)
                    else:
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error:
                    log.warning("WAL checkpoint failed; will retry", exc_info=True)
        finally:
            conn.close()

    def _reset_wal(self, conn: sqlite3.Connection) -> bool:
        """A TRUNCATE checkpoint with this process's readers held back; tried twice in a row, since
        a log past its bound grows by the whole write rate while it waits for the next tick. True
        when it did not finish (SQLite reports the log busy: a reader outlasted the wait, or the
        index process's transaction did)."""
        with self._read_gate.alone(_RESET_READERS_WAIT_S):
            for _ in range(2):
                if not conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
                    return False
        return True

    def _follow_budget(self) -> int:
        """Set the journal's and the backlog's bounds for the database's size now; returns the WAL's."""
        bounds = self.disk_budget.at(_file_size(Path(self.path)))
        self.journal.segment_bytes = bounds.segment_bytes  # read at the next append (rotation)
        self.backlog.set_max_bytes(bounds.backlog_bytes)
        return bounds.wal_bytes

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute("PRAGMA busy_timeout=30000")
        # a WAL reset by a completed checkpoint is also cut back to this size (not left at its peak)
        conn.execute(f"PRAGMA journal_size_limit={self.wal_limit_bytes}")
        return conn

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._indexer is not None:
            finished = self._indexer.stop(timeout_s=30)
            self.backlog.wake(always=True)  # whatever is left is in the journal: nobody waits on a closed store
            self._stop_checkpoints.set()
            self._checkpointer.join(timeout=30)
            # every record reached SQLite unless the indexer failed one: then the journal keeps it
            self.journal.close(remove=finished and not self._unindexed)
        if self._wconn is not None:
            try:
                self._wconn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error:
                pass
            self._wconn.close()

    # -- writes (event loop side) ----------------------------------------------------------------

    async def _submit(self, name: str, arg: Any) -> Any:
        if self._closed or self._indexer is None:
            raise RuntimeError("store is closed")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._indexer.submit((name, arg, fut, loop))
        # shield: a cancelled caller (agent hung up) must not un-write a record
        return await asyncio.shield(fut)

    async def append(self, record: PendingRecord) -> int:
        """Journal the record (durable when this returns) and hand it to the indexer.

        Two bounds on the indexer's lag (``backlog.py``). Bytes: the frame is journalled only once
        the unindexed journal has room for it (``max_backlog_bytes``), first come first served, so
        the journal on disk stays near that bound. Records: when the indexer is behind by more than
        ``_MAX_BACKLOG``, the call waits after journalling until it is back within that -- the next
        acknowledgement that brings the backlog down, not this record's own commit: under overload
        every call is slowed a little, in arrival order, instead of a few calls each waiting for
        the whole backlog ahead of them. Either way the reply follows the journal write.
        """
        if self._closed or self._indexer is None:
            raise RuntimeError("store is closed")
        parts = encode_record(record)
        nbytes = sum(len(p) for p in parts)  # the frame's payload, as ``Journal.append`` reports it
        room = self.backlog.reserve(nbytes)
        if room is not None:
            self._indexer.hurry()
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
            await asyncio.shield(drained)
        return seq

    async def _journal(self, item: PendingRecord | SessionRow, parts: list[bytes], name: str) -> int:
        if self.journal.fsync:  # an fsync takes milliseconds: not on the event loop
            return await asyncio.to_thread(self._journal_and_queue, item, parts, name)
        return self._journal_and_queue(item, parts, name)  # a write to the page cache takes microseconds

    def _journal_and_queue(self, item: PendingRecord | SessionRow, parts: list[bytes], name: str = "append") -> int:
        assert self._indexer is not None
        with self._append_lock:  # seq order, journal order and queue order are one order
            if self._indexer.failed:  # refuse before journalling: the agent's retry must not be a twin
                raise IndexerFailed(self._indexer.failed)
            if name == "append" and item.session_id in self._sealed:  # a session row may follow its close
                raise SessionSealed(f"session {item.session_id} is closed: its records are final")
            seq = self._next_seq
            where = self.journal.append(seq, parts)
            self._next_seq = seq + 1
            arg = (seq, item, where) if name == "append" else (seq, item)
            self._indexer.submit((name, arg, None, None))
        return seq

    async def caught_up(self) -> None:
        """Return once every record appended so far is in SQLite (what readers wait for).

        A store that was never opened is a reader of someone else's file (``trace --store``):
        there is nothing of ours to wait for. Records a crashed recorder left in its journal
        appear once a recorder opens the store again.
        """
        if self._indexer is None or self._closed:
            return
        await self._submit("nothing", None)

    def caught_up_sync(self, timeout_s: float = 60.0) -> None:
        """``caught_up`` for synchronous readers (blocks the calling thread)."""
        if self._closed or self._indexer is None or self._indexer.on_own_thread():
            return
        done = threading.Event()
        self._indexer.submit(("nothing", None, done, None))
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
        if self._closed or self._indexer is None:
            raise RuntimeError("store is closed")
        await self._journal(row, encode_session(row), "session")

    async def forget(self, session_id: str) -> None:
        """Drop what the writer caches for a finished session (it only speeds up later appends).
        Queued behind the session's records, and not waited for: nothing depends on when it runs."""
        if self._closed or self._indexer is None:
            return
        self._indexer.submit(("forget", session_id, None, None))

    def _op_forget(self, conn: sqlite3.Connection, session_id: str) -> None:
        self._recent.pop(session_id, None)

    # -- the indexer's side (a thread here, or the child process's copy of this store) -----------

    def _run_batch(self, conn: sqlite3.Connection, batch: list[tuple[str, Any]]) -> list[tuple[Any, BaseException | None]]:
        """All of ``batch`` (``(operation name, argument)``) in one transaction; if anything fails,
        each op again in its own.

        The common case pays one BEGIN and one COMMIT for the whole batch. A failure is rare (a
        disk error, a bug), and then only the op that fails is lost: the batch is rolled back and
        redone op by op, with the indexer's caches dropped first -- they may describe rows that the
        rollback removed, and they are only an optimisation.
        """
        try:
            conn.execute("BEGIN IMMEDIATE")
            results: list[tuple[Any, BaseException | None]] = [
                (getattr(self, _OPS[name])(conn, arg), None) for name, arg in batch]
            conn.execute("COMMIT")
        except Exception as exc:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            self._recent.clear()
            if len(batch) > 1:
                return [result for item in batch for result in self._run_batch(conn, [item])]
            log.exception("store operation failed")
            return [(None, exc)]
        return results

    def _committed(self, done: list[tuple[str, Any, Any, Any, Any, BaseException | None]]) -> None:
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
                        self._records_written += 1
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

    def _op_nothing(self, conn: sqlite3.Connection, arg: None) -> None:
        """A barrier: the indexer reaches it only after everything submitted before it is committed."""

    def _recent_for(self, session_id: str) -> "_Tail":
        tail = self._recent.get(session_id)
        if tail is None:
            tail = _Tail()
            self._recent[session_id] = tail
            if len(self._recent) > _HASH_CACHE_SESSIONS:
                self._recent.popitem(last=False)
        else:
            self._recent.move_to_end(session_id)
        return tail

    def _put_blobs(self, conn: sqlite3.Connection, pairs: list[tuple[bytes, bytes]], known: set[bytes],
                   *, compress: bool = True) -> None:
        fresh = [(h, blocks.pack_blob(data) if compress else blocks.raw_blob(data)) for h, data in pairs
                 if h not in known]
        if fresh:
            conn.executemany("INSERT OR IGNORE INTO blobs(hash, data) VALUES (?, ?)", fresh)

    def _op_append(self, conn: sqlite3.Connection, item: tuple) -> int:
        seq, rec = item[0], item[1]  # (seq, record[, where in the journal])
        tail = self._recent_for(rec.session_id)
        known = tail.known
        written: set[bytes] = set()

        prompt_len = 0
        prompt_delta: tuple[int | None, int, bytes | None] = (None, 0, None)
        prompt_bytes: bytes | None = None
        if rec.prompt_ids is not None:
            prompt_len = len(rec.prompt_ids)
            prompt_bytes = blocks.ids_to_bytes(rec.prompt_ids)
            digests = block_digests(prompt_bytes)
            prompt_delta = _prompt_delta(tail.prompts, prompt_bytes, digests)

        request = dict(rec.request)
        msgs_delta: tuple[int | None, int, bytes | None] = (None, 0, None)
        new_msgs: list[bytes] | None = None
        messages = request.get("messages")
        if isinstance(messages, list):
            pairs = blocks.message_blobs(messages)
            self._put_blobs(conn, pairs, known)
            new_msgs = [h for h, _ in pairs]
            written.update(new_msgs)
            msgs_delta = _delta(tail.msgs_seq, tail.msgs, new_msgs)
            request["messages"] = {_REF_MESSAGES: True}
        tools = request.get("tools")
        if isinstance(tools, list) and tools:
            data = orjson.dumps(tools)
            h = blocks.digest(data)
            self._put_blobs(conn, [(h, data)], known)
            written.add(h)
            request["tools"] = {_REF_TOOLS: h.hex()}

        md = rec.metadata
        conn.execute(
            "INSERT INTO records(seq, session_id, call_index, call_kind, status, trainable, request_digest,"
            " created_at, prompt_len, prompt_base, prompt_shared, prompt_tail, msgs_base, msgs_shared, msgs,"
            " completion_ids, logprobs, completion_tokens, request, response, metadata)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                seq,
                rec.session_id,
                rec.call_index,
                rec.call_kind,
                rec.status,
                1 if rec.trainable else 0,
                md.get("request_digest", ""),
                rec.created_at,
                prompt_len,
                *prompt_delta,
                *msgs_delta,
                blocks.ids_to_bytes(rec.completion_ids) if rec.completion_ids is not None else None,
                _floats_to_bytes(rec.logprobs) if rec.logprobs is not None else None,
                orjson.dumps(rec.completion_tokens) if rec.completion_tokens is not None else None,
                blocks.pack_blob(orjson.dumps(request)),
                blocks.pack_blob(orjson.dumps(rec.response)),
                blocks.pack_blob(orjson.dumps(md)),
            ),
        )
        if prompt_bytes is not None:
            tail.prompts.insert(0, PromptSketch(seq, prompt_bytes, digests))
            del tail.prompts[_PROMPT_BASES:]
        if new_msgs is not None:
            tail.msgs_seq, tail.msgs = seq, new_msgs
        tail.known = written
        return seq

    def _op_put_session(self, conn: sqlite3.Connection, item: tuple[int, SessionRow]) -> None:
        row = item[1]  # (seq in the journal, row)
        conn.execute(
            "INSERT INTO sessions(id, secret_digest, status, created_at, closed_at, stop_reason, spec, state)"
            " VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET status=excluded.status,"
            " closed_at=excluded.closed_at, stop_reason=excluded.stop_reason, state=excluded.state",
            (
                row.session_id,
                row.secret_digest,
                row.status,
                row.created_at,
                row.closed_at,
                row.stop_reason,
                orjson.dumps(row.spec),
                orjson.dumps(row.state),
            ),
        )

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
            return self._load_sessions(self._reader())

    def _load_sessions(self, conn: sqlite3.Connection) -> list[SessionRow]:
        next_index = dict(
            conn.execute("SELECT session_id, MAX(call_index) + 1 FROM records GROUP BY session_id").fetchall()
        )
        # budgets keep counting across a restart: totals are recomputed from the records themselves
        totals = {
            row[0]: {"calls": row[1], "agent_calls": row[2], "prompt_tokens": row[3], "completion_tokens": row[4],
                     "failed_calls": row[5], "invalid_calls": row[6]}
            for row in conn.execute(
                "SELECT session_id, COUNT(*),"
                " SUM(call_kind = 'agent' AND status != 'failed'),"
                " SUM(CASE WHEN status != 'failed' THEN prompt_len ELSE 0 END),"
                " SUM(COALESCE(LENGTH(completion_ids), 0) / 4),"
                " SUM(status = 'failed'), SUM(status = 'invalid')"
                " FROM records GROUP BY session_id"
            )
        }
        # tool calls handed over are not a column: the latest record's limits carry the count
        for session_id, md in conn.execute(
            "SELECT session_id, metadata FROM records WHERE seq IN (SELECT MAX(seq) FROM records GROUP BY session_id)"
        ):
            limits = orjson.loads(blocks.unpack_blob(md)).get("limits") or {}
            totals.setdefault(session_id, {})["tool_calls"] = int(limits.get("tool_calls") or 0)
        rows = conn.execute(
            "SELECT id, secret_digest, status, created_at, closed_at, stop_reason, spec, state FROM sessions"
        ).fetchall()
        return [
            SessionRow(
                session_id=r[0],
                secret_digest=r[1],
                status=r[2],
                created_at=r[3],
                closed_at=r[4],
                stop_reason=r[5],
                spec=orjson.loads(r[6]),
                state={**orjson.loads(r[7]), "totals": totals.get(r[0], {})},
                next_call_index=int(next_index.get(r[0], 0) or 0),
            )
            for r in rows
        ]

    async def read_records(self, session_id: str, *, after_seq: int = 0) -> list[dict[str, Any]]:
        await self.caught_up()
        return await asyncio.to_thread(self._read_records, session_id, after_seq)

    _COLUMNS = (
        "seq, prompt_base, prompt_shared, prompt_tail, msgs_base, msgs_shared, msgs, completion_ids, logprobs,"
        " completion_tokens, request, response, metadata, trainable, prompt_len"
    )

    def _read_records(self, session_id: str, after_seq: int, digest: str | None = None) -> list[dict[str, Any]]:
        with self._read_gate.reading():
            return self._read_records_in(self._reader(), session_id, after_seq, digest)

    def _read_records_in(self, conn: sqlite3.Connection, session_id: str, after_seq: int,
                         digest: str | None) -> list[dict[str, Any]]:
        sql = f"SELECT {self._COLUMNS} FROM records WHERE session_id = ? AND seq > ?"
        params: list[Any] = [session_id, after_seq]
        if digest is not None:
            sql += " AND request_digest = ? AND status = 'ok'"
            params.append(digest)
        rows = conn.execute(sql + " ORDER BY seq", params).fetchall()
        lists = _Lists(conn)
        blob_cache: dict[bytes, bytes] = {}
        return [self._decode_row(conn, row, blob_cache, lists) for row in rows]

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
            lists = _Lists(conn, keep=_STREAM_BASES)
            cache: dict[bytes, bytes] = {}
            sql = f"SELECT {self._COLUMNS} FROM records WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?"
            last = after_seq
            while True:
                with self._read_gate.reading():  # a page at a time: the gate is never held across a yield
                    rows = conn.execute(sql, (session_id, last, _STREAM_PAGE)).fetchall()
                    page = [self._decode_row(conn, row, cache, lists) for row in rows]
                for row, record in zip(rows, page):
                    yield record
                    last = row[0]
                if len(rows) < _STREAM_PAGE:
                    return
                if len(cache) > _STREAM_BLOBS:
                    cache.clear()
        finally:
            conn.close()

    def _blobs(self, conn: sqlite3.Connection, hashes: list[bytes], cache: dict[bytes, bytes]) -> None:
        missing = list({h for h in hashes if h not in cache})
        for i in range(0, len(missing), 500):
            chunk = missing[i : i + 500]
            marks = ",".join("?" * len(chunk))
            for h, data in conn.execute(f"SELECT hash, data FROM blobs WHERE hash IN ({marks})", chunk):
                cache[bytes(h)] = blocks.unpack_blob(data)
        lost = [h.hex() for h in hashes if h not in cache]
        if lost:
            raise RuntimeError(f"store is missing {len(lost)} blob(s), e.g. {lost[0]}")

    def _decode_row(self, conn: sqlite3.Connection, row: tuple, cache: dict[bytes, bytes],
                    lists: "_Lists") -> dict[str, Any]:
        (seq, pbase, pshared, pblocks, mbase, mshared, mtail, cids, lps, ctoks, req, resp, md, trainable,
         prompt_len) = row
        lists.remember(seq, pbase, pshared, pblocks, mbase, mshared, mtail)
        metadata = orjson.loads(blocks.unpack_blob(md))
        metadata["seq"] = seq
        prompt: list[int] = []
        prompt_bytes = lists.prompt(seq)
        if prompt_bytes is not None:
            prompt = blocks.bytes_to_ids(prompt_bytes).tolist()
            if len(prompt) != prompt_len:
                raise RuntimeError(f"record {seq}: prompt length {len(prompt)} != stored {prompt_len}")
        request = orjson.loads(blocks.unpack_blob(req))
        ref = request.get("messages")
        if isinstance(ref, dict) and _REF_MESSAGES in ref:
            hashes = lists.messages(seq) or []
            self._blobs(conn, hashes, cache)
            request["messages"] = [orjson.loads(cache[h]) for h in hashes]
        ref = request.get("tools")
        if isinstance(ref, dict) and _REF_TOOLS in ref:
            h = bytes.fromhex(ref[_REF_TOOLS])
            self._blobs(conn, [h], cache)
            request["tools"] = orjson.loads(cache[h])
        completion = blocks.bytes_to_ids(cids).tolist() if cids is not None else []
        logps = _bytes_to_floats(lps) if lps is not None else []
        entry: dict[str, Any] = {
            "request": request,
            "response": orjson.loads(blocks.unpack_blob(resp)),
            "prompt_token_ids": prompt,
            "completion_token_ids": completion,
            "per_token_logps": logps,
            "loss_mask": [0] * len(prompt) + [1 if trainable else 0] * len(completion),
            "metadata": metadata,
        }
        if ctoks is not None:
            entry["completion_tokens"] = orjson.loads(ctoks)
        return entry

    async def find_by_digest(self, session_id: str, request_digest: str) -> dict[str, Any] | None:
        await self.caught_up()
        rows = await asyncio.to_thread(self._read_records, session_id, 0, request_digest)
        return rows[-1] if rows else None

    def failure(self) -> str | None:
        if self._closed or self._indexer is None:
            return "the store is closed"
        return self._indexer.failed

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
            old = self._indexer
            if self._closed or old is None or old.failed is None:
                return False
            old.stop(timeout_s=10)  # its child is gone; this collects what it had not acknowledged
            again = sorted(self._unindexed.items())  # nothing else changes it now: no indexer runs
            lost = [seq for seq, (_, what) in again if what is None]
            if lost:  # not expected from a process indexer: every append it held says where it lies
                log.error("store: %d unindexed record(s) do not say where they lie; they are indexed at the "
                          "next open", len(lost))
            new = make_indexer(self.indexer_kind, self)
            new.start()
            self._indexer = new
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
        conn = self._reader()
        row_bytes = conn.execute(
            "SELECT COALESCE(SUM(LENGTH(COALESCE(prompt_tail, x'')) + LENGTH(COALESCE(msgs, x''))"
            " + LENGTH(COALESCE(completion_ids, x'')) + LENGTH(COALESCE(logprobs, x''))"
            " + LENGTH(request) + LENGTH(response) + LENGTH(metadata) + 48), 0) FROM records WHERE session_id = ?",
            (session_id,),
        ).fetchone()[0]
        lists = _Lists(conn)
        hashes: set[bytes] = set()
        for seq, pbase, pshared, pblocks, mbase, mshared, mtail, req in conn.execute(
            "SELECT seq, prompt_base, prompt_shared, prompt_tail, msgs_base, msgs_shared, msgs, request"
            " FROM records WHERE session_id = ? ORDER BY seq", (session_id,)
        ):
            lists.remember(seq, pbase, pshared, pblocks, mbase, mshared, mtail)
            hashes.update(lists.messages(seq) or [])
            ref = orjson.loads(blocks.unpack_blob(req)).get("tools")
            if isinstance(ref, dict):
                hashes.add(bytes.fromhex(ref[_REF_TOOLS]))
        blob_bytes = 0
        hl = list(hashes)
        for i in range(0, len(hl), 500):
            chunk = hl[i : i + 500]
            marks = ",".join("?" * len(chunk))
            blob_bytes += conn.execute(
                f"SELECT COALESCE(SUM(LENGTH(data) + LENGTH(hash)), 0) FROM blobs WHERE hash IN ({marks})", chunk
            ).fetchone()[0]
        return {"row_bytes": int(row_bytes), "blob_bytes": int(blob_bytes), "total": int(row_bytes + blob_bytes)}


class _Tail:
    """What a session's latest record stored: the base of the next record's deltas."""

    __slots__ = ("prompts", "msgs_seq", "msgs", "known")

    def __init__(self) -> None:
        #: the session's latest records' prompts, as sketches (``prompt_sketch.py``): candidate bases, newest first
        self.prompts: list[PromptSketch] = []
        self.msgs_seq: int | None = None
        self.msgs: list[bytes] = []
        #: blob hashes the latest record stored: not inserted again by the next one
        self.known: set[bytes] = set()


def _delta(base_seq: int | None, base: list[bytes], new: list[bytes]) -> tuple[int | None, int, bytes]:
    """``(base_seq, shared, tail)``: ``new`` as the first ``shared`` hashes of ``base`` plus a tail.

    Every call repeats the history, so a record keeps only what its predecessor did not have: storage
    per record follows the *new* content, not the conversation length.
    """
    shared = 0
    if base_seq is not None:
        limit = min(len(base), len(new))
        while shared < limit and base[shared] == new[shared]:
            shared += 1
    if shared == 0:
        return None, 0, blocks.join_hashes(new)
    return base_seq, shared, blocks.join_hashes(new[shared:])


class _Lists:
    """Resolves the delta-encoded hash lists of records, loading bases from the store as needed."""

    def __init__(self, conn: sqlite3.Connection, *, keep: int | None = None) -> None:
        self._conn = conn
        #: resolved values kept (the latest first in line to stay), None: all -- a base dropped
        #: early is only walked back to again
        self._keep = keep
        self._rows: dict[int, tuple] = {}
        self._prompts: dict[int, bytes | None] = {}
        self._msgs: dict[int, list[bytes] | None] = {}

    def remember(self, seq: int, *row: Any) -> None:
        self._rows[seq] = row
        if self._keep is not None:
            for memo in (self._rows, self._prompts, self._msgs):
                while len(memo) > self._keep:
                    del memo[next(iter(memo))]  # dicts keep insertion order: the oldest goes

    def _row(self, seq: int) -> tuple:
        row = self._rows.get(seq)
        if row is None:
            got = self._conn.execute(
                "SELECT prompt_base, prompt_shared, prompt_tail, msgs_base, msgs_shared, msgs FROM records"
                " WHERE seq = ?", (seq,)
            ).fetchone()
            if got is None:
                raise RuntimeError(f"store is missing record {seq}, the base of a later record")
            row = tuple(got)
            self._rows[seq] = row
        return row

    def _resolve(self, seq: int, offset: int, memo: dict[int, Any]) -> Any:
        """Record ``seq``'s value: its base's first ``shared`` items plus its own tail (prompt bytes at
        offset 0, ``shared`` in tokens of 4 bytes; message-hash lists at offset 3)."""
        chain: list[int] = []
        cur: int | None = seq
        while cur is not None and cur not in memo:  # walk back iteratively: chains can be long
            chain.append(cur)
            base, _shared, tail = self._row(cur)[offset : offset + 3]
            cur = base if tail is not None else None
        for s in reversed(chain):
            base, shared, tail = self._row(s)[offset : offset + 3]
            if tail is None:
                memo[s] = None  # this record has no such list (e.g. a failed call has no prompt)
                continue
            if offset == 0:
                memo[s] = bytes(tail) if base is None else (memo.get(base) or b"")[: shared * 4] + tail
            else:
                own = blocks.split_hashes(tail)
                memo[s] = own if base is None else (memo.get(base) or [])[:shared] + own
        return memo[seq]

    def prompt(self, seq: int) -> bytes | None:
        return self._resolve(seq, 0, self._prompts)

    def messages(self, seq: int) -> list[bytes] | None:
        return self._resolve(seq, 3, self._msgs)


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _resolve(fut: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


def _floats_to_bytes(values: array) -> bytes:
    return blocks.ids_to_bytes(values)  # same little-endian rule, typecode 'd'


def _bytes_to_floats(data: bytes) -> list[float]:
    return blocks.bytes_to_ids(data, "d").tolist()
