"""How every connection to the store's SQLite file is set up, in the recorder and in the index process.

Why one function: the writer, the readers, the checkpointer and the index process must agree on
the file's journal mode and durability (WAL, the configured ``synchronous``), and a connection set
up differently -- a rollback journal, no busy timeout -- would fail or block the others.
"""

from __future__ import annotations

import sqlite3

#: WAL size past which a checkpoint resets the log (``checkpointer.py``); a log reset by a completed
#: checkpoint is also cut back to this size. The store's disk footprint is then its content, the
#: journal's open segment and at most about this much more (less while the database is small:
#: ``disk_budget.py``).
WAL_LIMIT_BYTES = 8 << 20


def connect(path: str, synchronous: str, wal_limit_bytes: int = WAL_LIMIT_BYTES) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), usable from any thread."""
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA busy_timeout=30000")
    # a WAL reset by a completed checkpoint is also cut back to this size (not left at its peak)
    conn.execute(f"PRAGMA journal_size_limit={wal_limit_bytes}")
    return conn
