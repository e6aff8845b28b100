"""The WAL checkpointer: a thread that copies SQLite's write-ahead log into the database, and resets
the log once it is past its bound.

Why a thread of its own: the writer runs with automatic checkpoints off (one would stall a commit,
and every reply waiting on it, for milliseconds), so something else must copy the log back. A
PASSIVE checkpoint, a few times a second, never blocks anyone; but it cannot shrink the log: the
file is reused from its start only when a writer finds every frame copied and no reader on it,
which a writer that never pauses does not allow -- the WAL then grows with everything written until
the recorder stops. So past its bound the checkpoint is a TRUNCATE: it holds the indexer's next
transaction back while it copies what is left (off the reply path: agents wait only on the journal)
and empties the file. It waits for readers on older snapshots at most ``CHECKPOINT_WAIT_MS``; if one
is still reading, the copy done so far stays and the reset is tried again at once, then on the next
tick. This process's new readers are held back while it runs (``read_gate.py``): readers that
follow one another without a pause would defeat it tick after tick.

It is built from what it uses -- a way to connect to the file, the readers' gate, and the bound --
and never sees the store. The bound is asked for on every tick, since it follows the database's
size (``disk_budget.py``): the store's answer also moves the journal's and the backlog's bounds.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

from openenv_harness.recorder.store.read_gate import ReadGate

#: logged under the store's name, whichever of its modules logs: one logger to configure for the store
log = logging.getLogger("openenv_harness.recorder.store.sqlite")

#: The checkpointer copies the WAL into the database this often (seconds), off the writer thread.
CHECKPOINT_EVERY_S = 0.25
#: How long a resetting checkpoint waits for readers (and holds the indexer back) before it retries later.
CHECKPOINT_WAIT_MS = 200
#: How long a WAL reset waits, with new readers held back, for this process's readers inside to finish.
RESET_READERS_WAIT_S = 1.0


class Checkpointer:
    """Checkpoints the WAL of the database at ``path`` on a thread of its own, from ``start`` to ``stop``.

    ``connect`` opens a connection to that database; ``read_gate`` is the one this process's readers
    pass; ``wal_bound`` answers, on each tick, the WAL size past which the log is reset.
    """

    def __init__(self, path: str, connect: Callable[[], sqlite3.Connection], read_gate: ReadGate,
                 wal_bound: Callable[[], int]) -> None:
        self._wal = Path(path + "-wal")
        self._connect = connect
        self._read_gate = read_gate
        self._wal_bound = wal_bound
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="oeh-store-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        conn = self._connect()
        conn.execute(f"PRAGMA busy_timeout={CHECKPOINT_WAIT_MS}")
        try:
            while not self._stop.wait(CHECKPOINT_EVERY_S):
                try:
                    if file_size(self._wal) > self._wal_bound():
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
        with self._read_gate.alone(RESET_READERS_WAIT_S):
            for _ in range(2):
                if not conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]:
                    return False
        return True


def file_size(path: Path) -> int:
    """The file's size, 0 while it does not exist (a WAL before the first write)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
