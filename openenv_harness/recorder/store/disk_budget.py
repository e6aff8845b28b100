"""What the store may keep on disk beyond its content, scaled with that content.

Three files hold more than the records: the SQLite write-ahead log (reset by a TRUNCATE checkpoint
once past a size), the journal's unindexed frames (``backlog.py``: appends wait past a byte bound)
and the journal's open segment (deleted once closed and indexed, so it grows to its rotation size
before it can go). A fixed bound (8 MiB, 16 MiB and 4 MiB) is small beside a long run's content but
several times the content of a run's first seconds, so a short run's store would be several times
its records (``docs/benchmarks.md``, "Steady-state footprint").

So each bound is a share of what the SQLite file holds, between a small floor and the configured
bound: ``min(configured, max(floor, share x database bytes))``. Once the database is large enough
(20 MB for the WAL and the segment, 16 MB for the backlog at the defaults) every bound is
the configured one -- the agents' calls wait on nothing new in a long run; only while the
store is small can the byte bound hold appends back sooner. The shares add up to about 1.8x the
database (the journal's open segment counts twice: the closed one before it may not be deleted
yet), and the parts rarely peak together, so with SQLite's file itself the store stays under 3x
its content (2.6x at most, measured); the floors are what a store of a MB or less cannot get
under (64 agents' first calls at 8k ids are ~6 MB of frames).

The database's size only grows (records are never deleted), so the bounds only grow: a byte bound
that grows lets waiting appends in at once (``AppendBacklog.set_max_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The WAL is reset once past this share of the database, at least 1 MiB (below it a small store's
#: WAL would be reset on nearly every tick of the checkpointer, for little).
WAL_SHARE, WAL_FLOOR = 0.4, 1 << 20
#: Unindexed journal bytes past which appends wait: this share of the database, at least 1 MiB
#: (a few first frames; a lone larger frame always goes in, ``backlog.py``). Measured from a fresh
#: store at 64 busy sessions (15 s, 8k-19k ids; ``docs/benchmarks.md``): at half the database the
#: agents made 106-133 calls/s against 117-169 with the fixed 16 MiB (five pairs); at the whole
#: database 135-284 against 132-200 (four) -- within the machine's drift, and the ratio stays under 3x.
BACKLOG_SHARE, BACKLOG_FLOOR = 1.0, 1 << 20
#: The journal's segments rotate past this share of the database, at least 256 KiB.
SEGMENT_SHARE, SEGMENT_FLOOR = 0.2, 256 << 10


def scaled(held: int, share: float, floor: int, configured: int) -> int:
    """``min(configured, max(floor, share x held))``: never above what was configured."""
    return min(configured, max(floor, int(share * held)))


@dataclass(frozen=True)
class Bounds:
    wal_bytes: int
    backlog_bytes: int
    segment_bytes: int


@dataclass(frozen=True)
class DiskBudget:
    """The configured bounds (the most each may be) and what they are at a given database size."""

    wal_bytes: int
    backlog_bytes: int
    segment_bytes: int

    def __post_init__(self) -> None:
        if min(self.wal_bytes, self.backlog_bytes, self.segment_bytes) <= 0:
            raise ValueError("disk bounds must be positive")

    def at(self, db_bytes: int) -> Bounds:
        """The bounds for a database of ``db_bytes`` (the SQLite file's size)."""
        return Bounds(
            wal_bytes=scaled(db_bytes, WAL_SHARE, WAL_FLOOR, self.wal_bytes),
            backlog_bytes=scaled(db_bytes, BACKLOG_SHARE, BACKLOG_FLOOR, self.backlog_bytes),
            segment_bytes=scaled(db_bytes, SEGMENT_SHARE, SEGMENT_FLOOR, self.segment_bytes),
        )
