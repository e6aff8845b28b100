"""Who moves journalled records into SQLite: a thread of the recorder, or a child process.

Why two: indexing (deltas, hashing, compression, SQLite) runs after each reply, but in a thread it
shares the interpreter lock with the event loop. Measured at one 8k-token session, that sharing
alone added ~2 ms to the p99 of every call (``docs/benchmarks.md``): the loop, woken by the next
request, waits for the writer's Python to let go. A child process has its own interpreter, so the
event loop only writes the journal and sends the child a few bytes per record saying where it is.

Both run the indexer's operations (``IndexOps.run_batch``, ``index_ops.py``) in one transaction per
batch, in submission order, and report each batch back through the ``committed`` callback they are
built with (``JournalQueue.committed``) -- the same path, whichever runs it. Neither knows the store:
each is built from the pieces it uses (``make_indexer``). The thread variant stays for library use
where a child process is unwanted, and for tests that replace the operations in-process.

The child reads each record from the journal itself (a ``pread`` of the frame the recorder wrote),
so nothing large crosses the pipe. If the child dies, every operation it had not acknowledged is
sent again to a new one, which skips records SQLite already has: nothing acknowledged to an agent
is lost, and nothing is indexed twice. A child that keeps dying fails the store loudly instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import queue
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from openenv_harness.recorder.store.backlog import AppendBacklog
from openenv_harness.recorder.store.index_ops import IndexOps
from openenv_harness.recorder.store.index_priority import NICENESS

log = logging.getLogger(__name__)

#: An operation as the journal queue submits it: (name, argument, waiter, loop) -- see
#: ``JournalQueue.committed``.
Item = tuple[str, Any, Any, Any]
#: An operation once its transaction is over: ``Item`` plus its value and its error (None if none).
Done = tuple[str, Any, Any, Any, Any, BaseException | None]
#: Told of every finished operation, in submission order, on the indexer's own thread.
Committed = Callable[[list[Done]], None]
#: What goes to the index process per operation: (token, name, payload, resent, waited).
Message = tuple[int, str, Any, bool, bool]
#: Operations per transaction: bounds how long a call waiting on the backlog waits.
MAX_BATCH = 512
#: The index process's batches are smaller: it decodes every record of a batch from the journal
#: before the transaction, and its memory follows the largest batch (measured at 64 sessions of 8k
#: prompts: 512 → ~90 MB resident, 32 → ~60 MB), while commits stay cheap (WAL, no fsync).
CHILD_MAX_BATCH = 32
#: Records journalled but not yet in SQLite beyond which an ``append`` waits until the indexer has
#: brought the backlog back under this: it bounds how far the index (what readers see) lags behind.
MAX_BACKLOG = 64
#: Child restarts allowed within ``RESTART_WINDOW_S`` before the store gives up.
MAX_RESTARTS = 3
RESTART_WINDOW_S = 60.0


class IndexerFailed(RuntimeError):
    """The indexer cannot go on: appends fail (agents get a retryable 503), the journal keeps all."""


class ThreadIndexer:
    """The indexer's operations on one thread of this process, on the store's write connection."""

    def __init__(self, ops: IndexOps, conn: sqlite3.Connection, committed: Committed) -> None:
        self._ops = ops
        self._conn = conn
        self._committed = committed
        self._queue: queue.SimpleQueue[Item | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="oeh-store-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, item: Item, *, resent: bool = False) -> None:
        self._queue.put(item)

    def backlog(self) -> int:
        return self._queue.qsize()

    def hurry(self) -> None:
        """Someone waits for the backlog to shrink: a thread runs at the recorder's priority already."""

    @property
    def failed(self) -> str | None:
        return None

    def on_own_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def stop(self, timeout_s: float) -> bool:
        """Finish what was submitted, then stop. True if everything submitted was run."""
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        conn = self._conn
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            stop = False
            while len(batch) < MAX_BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            results = self._ops.run_batch(conn, [(name, arg) for name, arg, _, _ in batch])
            self._committed([(*item, *result) for item, result in zip(batch, results, strict=True)])
            if stop:
                return


class ProcessIndexer:
    """The indexer's operations in a child process, fed through a socket pair.

    Messages to the child: ``(token, name, payload, resent, waited)``, sent as lists of up to
    ``CHILD_MAX_BATCH``; ``payload`` for an append is ``(seq, where)`` -- where its frame lies in
    the journal -- and the operation's argument otherwise; ``waited`` says someone waits for it, so
    the child acknowledges at once. Replies are cumulative: ``(every token up to T is done,
    {token: error text})`` (``index_child.py``).

    An operation nobody waits for, submitted on an event loop, is not sent at once but on the
    loop's next turn: the call that journalled it has handed its reply to the kernel by then, so
    the send (a pickle and a syscall that wakes the child) is not in the agent's latency, and the
    records of every call finishing in the same turn go to the child in one message.
    """

    def __init__(self, committed: Committed, *, path: str, synchronous: str, priority: str,
                 backlog: AppendBacklog, home_loop: asyncio.AbstractEventLoop | None,
                 python: str = sys.executable) -> None:
        self.python = python
        #: the database the child opens, how it syncs, and its CPU priority: its command line
        self._argv = [path, synchronous, priority]
        self._committed = committed
        #: appends held back (or about to be) raise an ``idle`` child at once (``_flush_locked``)
        self._backlog = backlog
        #: the event loop that opened the store (the recorder's chat loop): sends are deferred to a
        #: turn of that loop only; another thread's loop (the admin listener) sends at once
        self._home_loop = home_loop
        self._lock = threading.Lock()
        self._tokens = itertools.count(1)
        #: token -> (item, message): sent and not yet acknowledged, in submission order
        self._pending: dict[int, tuple[Item, Message]] = {}
        #: messages not sent yet, waiting for the event loop's next turn (see the class docstring)
        self._outbox: list[Message] = []
        #: the token of the outstanding request to acknowledge at once (``hurry``), if any
        self._hurry_token = 0
        self._appends_pending = 0
        self._conn: Connection | None = None
        self._child: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._stopping = False
        self._failed: str | None = None
        self._restarts: list[float] = []
        #: hands the operations a failed indexer held back to ``committed`` (``_fail``)
        self._failing: threading.Thread | None = None
        #: an ``idle`` child is raised from here when behind (``_wake_child``)
        self._adaptive = priority == "idle"
        self._own_nice = os.getpriority(os.PRIO_PROCESS, 0)

    @property
    def failed(self) -> str | None:
        return self._failed

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    def start(self) -> None:
        with self._lock:
            self._spawn()

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        argv = [self.python, "-m", "openenv_harness.recorder.store.index_child", str(theirs.fileno()), *self._argv]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._child = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)
        theirs.close()
        if self._conn is not None:
            self._conn.close()  # a dead child's socket: its reader thread is the one replacing it
        self._conn = Connection(ours.detach())
        self._reader = threading.Thread(target=self._read_acks, args=(self._conn, self._child),
                                        name="oeh-store-indexer", daemon=True)
        self._reader.start()

    def submit(self, item: Item, *, resent: bool = False) -> None:
        """``resent``: an append that may be in SQLite already (``JournalQueue.recover``); skipped if so."""
        name, arg = item[0], item[1]
        if name == "append":
            # The child reads the frame from the journal, so the record itself is not kept here: held
            # until acknowledged, each record's parsed request and reply would stay alive for a dozen
            # calls, and the garbage collector's young generations would walk them again and again.
            seq, _, where = arg
            payload = (seq, where)
            item = (name, (seq, None, where), item[2], item[3])
        else:
            payload = arg
        with self._lock:
            if self._failed is not None:
                raise IndexerFailed(self._failed)
            token = next(self._tokens)
            waited = item[2] is not None
            message: Message = (token, name, payload, resent, waited)
            self._pending[token] = (item, message)
            self._appends_pending += name == "append"
            self._outbox.append(message)
            loop = None if waited else _running_loop()
            home = self._home_loop
            if loop is not None and home is not None and loop is not home:
                # another thread's loop (the admin listener): a flush left to it would hold the chat
                # loop's later sends too, and that loop may stop before it turns again
                loop = None
            if loop is None:  # someone waits for it, or no event loop will turn: now
                self._flush_locked()
            elif len(self._outbox) == 1:  # otherwise a flush is already due
                loop.call_soon(self.flush)

    def flush(self) -> None:
        """Send what waits in the outbox."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        out, self._outbox = self._outbox, []
        for i in range(0, len(out), CHILD_MAX_BATCH):
            self._send(out[i : i + CHILD_MAX_BATCH])
        if self._adaptive and out:
            if self._backlog.over() or any(m[4] for m in out):
                self._wake_child(0)  # replies are held back (records or bytes), or someone waits: as high as the recorder
            elif self._appends_pending >= CHILD_MAX_BATCH:
                self._wake_child(NICENESS)  # a batch behind: catch up, still after a waking call

    def hurry(self) -> None:
        """A reply waits for the indexer's progress (room in the backlog's bytes, or the record bound;
        ``backlog.py``): ask the child to say at once what it has indexed, and raise an ``idle`` child.

        Why a message: the child acknowledges lazily when nobody waits (``index_child.py``: every
        ``ACK_EVERY`` operations or ``ACK_AFTER_S`` seconds), and the appends the reply waits behind
        were sent as nobody's. Without this the waiting reply learned of their indexing only at the
        child's next timed acknowledgement, whatever the child's speed. One request is outstanding
        at a time: its acknowledgement covers every operation sent before it, which is all a waiter
        for room can need (no append is journalled while one waits, first come first served)."""
        with self._lock:
            if self._failed is not None:
                return
            if self._hurry_token not in self._pending:
                token = next(self._tokens)
                message: Message = (token, "nothing", None, False, True)
                self._pending[token] = (("nothing", None, None, None), message)
                self._outbox.append(message)
                self._hurry_token = token
            self._flush_locked()  # the outbox too: the appends waited behind may still be in it
            if self._adaptive:
                self._wake_child(0)

    def _wake_child(self, below: int) -> None:
        """Raise an ``idle`` index process to the normal policy, ``below`` nice steps under the recorder.

        Why from here: a process under ``SCHED_IDLE`` on cores kept busy by others may not run for a
        long while, so it cannot be the one to notice (``index_priority.py``). It lowers itself again
        once its queue is empty. Sent after the messages, so a child that lowers itself just before
        they arrive is raised again; a system that refuses (the child then runs at ``low``) is fine.
        """
        child = self._child
        if child is None:
            return
        try:
            os.setpriority(os.PRIO_PROCESS, child.pid, min(19, self._own_nice + below))
            os.sched_setscheduler(child.pid, os.SCHED_OTHER, os.sched_param(0))
        except (OSError, AttributeError):
            pass

    def _send(self, messages: list[Message]) -> None:
        assert self._conn is not None
        # the child gone: the reader thread restarts it and sends everything pending again
        with contextlib.suppress(OSError):
            self._conn.send(messages)

    def backlog(self) -> int:
        return self._appends_pending

    def on_own_thread(self) -> bool:
        return threading.current_thread() is self._reader

    def stop(self, timeout_s: float) -> bool:
        with self._lock:
            self._stopping = True
            if self._failed is None:
                self._outbox.append((0, "stop", None, False, True))
                self._flush_locked()
        reader, child = self._reader, self._child
        if reader is not None:
            reader.join(timeout=timeout_s)
        if self._failing is not None:
            self._failing.join(timeout=timeout_s)
        clean = child is not None and _wait(child, timeout_s) == 0 and not self._pending
        if self._conn is not None:
            self._conn.close()
        return clean

    # -- the reader thread ---------------------------------------------------------------------------

    def _read_acks(self, conn: Connection, child: subprocess.Popen[bytes]) -> None:
        while True:
            try:
                acks = conn.recv()
            except (EOFError, OSError):
                break
            self._acknowledge(acks)
        if self._stopping:
            return
        code = _wait(child, 5.0)
        log.error("store: the index process exited (%s) with %d operation(s) unacknowledged",
                  code, len(self._pending))
        self._restart()

    def _acknowledge(self, acks: tuple[int, dict[int, str]]) -> None:
        through, errors = acks
        done: list[Done] = []
        with self._lock:
            finished = list(itertools.takewhile(lambda token: token <= through, self._pending))
            for token in finished:
                item = self._pending.pop(token)[0]
                error = errors.get(token)
                self._appends_pending -= item[0] == "append"
                failure = RuntimeError(f"store operation {item[0]!r} failed: {error}") if error else None
                value = item[1][0] if item[0] == "append" else None
                done.append((*item, value, failure))
        if done:
            self._committed(done)

    def _restart(self) -> None:
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW_S] + [now]
        with self._lock:
            if self._stopping:
                return
            if len(self._restarts) > MAX_RESTARTS:
                self._fail(f"the index process died {len(self._restarts)} times in {RESTART_WINDOW_S:.0f}s")
                return
            try:
                self._spawn()
            except OSError as exc:
                self._fail(f"cannot start the index process: {exc}")
                return
            # everything unacknowledged, the outbox included, goes again: the child skips what SQLite has
            self._outbox = [(token, message[1], message[2], True, message[4])
                            for token, (item, message) in self._pending.items()]
            self._flush_locked()

    def _fail(self, why: str) -> None:
        """Called with the lock held: nothing more can be indexed until the store is opened again."""
        log.error("store: %s; records stay in the journal and are indexed when the store opens again", why)
        self._failed = why
        self._outbox = []
        pending, self._pending = list(self._pending.values()), {}
        self._appends_pending = 0
        error = IndexerFailed(why)
        done: list[Done] = [(*item, None, error) for item, _ in pending]
        if done:
            self._failing = threading.Thread(target=self._committed, args=(done,), daemon=True)
            self._failing.start()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _wait(child: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    try:
        return child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait(timeout=timeout_s)


#: Either indexer: what the journal queue submits to and follows.
Indexer = ThreadIndexer | ProcessIndexer
#: Builds an indexer that reports to the callback it is given (the journal queue builds one at the
#: store's open, and a replacement in ``JournalQueue.recover``).
IndexerFactory = Callable[[Committed], Indexer]


def make_indexer(kind: str, committed: Committed, *, ops: IndexOps, conn: sqlite3.Connection, path: str,
                 synchronous: str, priority: str, backlog: AppendBacklog,
                 home_loop: asyncio.AbstractEventLoop | None, python: str = sys.executable) -> Indexer:
    """A thread indexer (``ops`` on ``conn``, the store's write connection) or an index process (on
    the database at ``path``, run by ``python``); each takes only the pieces its kind uses."""
    if kind == "thread":
        return ThreadIndexer(ops, conn, committed)
    if kind == "process":
        return ProcessIndexer(committed, path=path, synchronous=synchronous, priority=priority, backlog=backlog,
                              home_loop=home_loop, python=python)
    raise ValueError(f"indexer must be 'thread' or 'process', not {kind!r}")
