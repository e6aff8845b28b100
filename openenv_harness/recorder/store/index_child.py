"""The index process: ``python -m openenv_harness.recorder.store.index_child FD DB SYNCHRONOUS [PRIORITY]``.

Started by ``indexer.ProcessIndexer``; runs the indexer's operations (``index_ops.py``) on its own
SQLite connection and reads each record from the journal frame the recorder wrote. It builds no
store: the operations, a connection set up as the recorder's are (``connection.py``) and a reader
of the journal's segments are all it uses. It exits when told to stop or when the recorder's end
of the socket closes (the recorder died: nothing is left to do, and the journal keeps every record
for the next open).
"""

from __future__ import annotations

import logging
import sqlite3
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from openenv_harness.recorder.heap import HeapTrimmer
from openenv_harness.recorder.store.connection import connect
from openenv_harness.recorder.store.index_ops import IndexOps
from openenv_harness.recorder.store.index_priority import Scheduling
from openenv_harness.recorder.store.indexer import CHILD_MAX_BATCH, Message
from openenv_harness.recorder.store.journal import Journal, decode_record, journal_directory

log = logging.getLogger(__name__)

#: Acknowledge at least this often (appends, seconds) when nobody waits: the recorder's backlog count
#: and journal clean-up follow the acks, but each one costs the recorder a wake-up and its lock.
ACK_EVERY = 16
ACK_AFTER_S = 0.2
#: With nothing queued, the process still wakes this often (seconds) to lower its priority again:
#: the recorder raises it from outside after sending it work, and a raise that lands after that work
#: is done would otherwise leave an idle process at normal priority until more work comes.
IDLE_RECHECK_S = 1.0


def serve(conn: Connection, ops: IndexOps, db: sqlite3.Connection, journal: Journal,
          scheduling: Scheduling | None = None) -> None:
    """Batches of operations in arrival order, one transaction each, run by ``ops`` on ``db``; an
    append's record is read from ``journal`` (only read: the recorder holds it).

    Acknowledgements are cumulative -- ``(every token up to T is done, {token: error})`` -- and sent
    at once when someone waits (a barrier, a session write, an append held back by the backlog) or
    an operation failed, otherwise every ``ACK_EVERY`` operations or ``ACK_AFTER_S`` seconds.
    ``scheduling`` is told when the queue is empty and when it is behind (``index_priority.py``).
    """
    scheduling = scheduling or Scheduling("normal")
    done_through, unacked, last_ack = 0, 0, time.monotonic()
    while True:
        try:
            if not conn.poll():
                scheduling.caught_up()
                if not conn.poll(ACK_AFTER_S if unacked else IDLE_RECHECK_S):
                    if unacked:
                        conn.send((done_through, {}))
                        unacked, last_ack = 0, time.monotonic()
                    continue
            messages: list[Message] = list(conn.recv())  # the recorder sends lists of at most CHILD_MAX_BATCH
            while len(messages) < CHILD_MAX_BATCH and conn.poll():
                messages.extend(conn.recv())
            if (len(messages) >= CHILD_MAX_BATCH and conn.poll()) or any(m[4] for m in messages):
                scheduling.behind()  # more than a batch queued, or someone waits
        except (EOFError, OSError):
            return
        stop = any(m[1] == "stop" for m in messages)
        batch: list[tuple[str, Any]] = []
        tokens: list[int] = []
        errors: dict[int, str] = {}
        urgent = False
        for token, name, payload, resent, waited in messages:
            if name == "stop":
                continue
            urgent = urgent or waited
            done_through = max(done_through, token)
            if name == "append":
                seq, where = payload
                if resent and db.execute("SELECT 1 FROM records WHERE seq = ?", (seq,)).fetchone():
                    continue  # committed before the previous child died
                try:
                    payload = (seq, decode_record(journal.read_payload(where)))
                except (OSError, ValueError) as exc:
                    errors[token] = f"cannot read record {seq} from the journal: {exc}"
                    continue
            batch.append((name, payload))
            tokens.append(token)
        results = ops.run_batch(db, batch) if batch else []
        errors.update({token: f"{type(error).__name__}: {error}"
                       for token, (_, error) in zip(tokens, results, strict=True) if error is not None})
        unacked += len(messages)
        if urgent or errors or stop or unacked >= ACK_EVERY or time.monotonic() - last_ack >= ACK_AFTER_S:
            conn.send((done_through, errors))
            unacked, last_ack = 0, time.monotonic()
        if stop:
            return


def main(argv: list[str]) -> None:
    fd, path, synchronous = int(argv[0]), argv[1], argv[2]
    scheduling = Scheduling(argv[3] if len(argv) > 3 else "idle")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    conn = Connection(fd)
    scheduling.apply()
    # each batch allocates and frees requests and prompts of every size: without handing freed
    # memory back, glibc keeps the high-water mark of the busiest second (measured: ~100 MB at 64 sessions)
    trimmer = HeapTrimmer().start()
    db = connect(path, synchronous)
    db.execute("PRAGMA wal_autocheckpoint=0")  # the recorder's checkpointer does it, never blocking us
    try:
        serve(conn, IndexOps(), db, Journal(journal_directory(path)), scheduling)  # never acquired: only read
    finally:
        db.close()
        trimmer.stop()
        conn.close()


if __name__ == "__main__":
    main(sys.argv[1:])
