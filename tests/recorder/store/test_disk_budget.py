"""The store's bounds on what it keeps beyond its content follow the size of its database.

With fixed bounds (WAL 8 MiB, unindexed journal 16 MiB, journal segment 4 MiB) a store of a few MB
kept several times its content on disk. These tests check the policy (a share of the database,
between a floor and the configured bound), that a small store applies it to the WAL, the journal's
segments and its appends, and that the bounds grow with the database, reopened or not.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from openenv_harness.recorder.store import SQLiteStore
from openenv_harness.recorder.store.backlog import MAX_BACKLOG_BYTES
from openenv_harness.recorder.store.disk_budget import (BACKLOG_FLOOR, BACKLOG_SHARE, SEGMENT_FLOOR, WAL_FLOOR,
                                                         WAL_SHARE, DiskBudget)
from openenv_harness.recorder.store.journal import SEGMENT_BYTES, encode_record
from openenv_harness.recorder.store.connection import WAL_LIMIT_BYTES

from test_disk_bound import _rec as _fresh_rec
from test_journal import _rec
from writer_stall import stall_writer

MB = 1 << 20
BIG = 60_000  # ids: a frame of ~240 KB, so a handful of frames pass the 1 MiB floor


def test_bounds_are_a_share_of_the_database_between_a_floor_and_what_was_configured() -> None:
    budget = DiskBudget(wal_bytes=WAL_LIMIT_BYTES, backlog_bytes=MAX_BACKLOG_BYTES, segment_bytes=SEGMENT_BYTES)
    empty = budget.at(0)
    assert (empty.wal_bytes, empty.backlog_bytes, empty.segment_bytes) == (WAL_FLOOR, BACKLOG_FLOOR, SEGMENT_FLOOR)
    middle = budget.at(10 * MB)
    assert middle.wal_bytes == int(WAL_SHARE * 10 * MB) and middle.backlog_bytes == int(BACKLOG_SHARE * 10 * MB)
    assert WAL_FLOOR < middle.wal_bytes < WAL_LIMIT_BYTES
    large = budget.at(1 << 30)
    assert (large.wal_bytes, large.backlog_bytes, large.segment_bytes) == (WAL_LIMIT_BYTES, MAX_BACKLOG_BYTES,
                                                                           SEGMENT_BYTES)
    sizes = [0, MB, 3 * MB, 10 * MB, 30 * MB, 100 * MB]
    for lo, hi in zip(sizes, sizes[1:]):  # a growing database never lowers a bound
        a, b = budget.at(lo), budget.at(hi)
        assert (a.wal_bytes, a.backlog_bytes, a.segment_bytes) <= (b.wal_bytes, b.backlog_bytes, b.segment_bytes)
    tiny = DiskBudget(wal_bytes=4096, backlog_bytes=1024, segment_bytes=100).at(0)
    assert (tiny.wal_bytes, tiny.backlog_bytes, tiny.segment_bytes) == (4096, 1024, 100), \
        "a configured bound below the floor is kept: the floor never raises a bound"
    with pytest.raises(ValueError):
        DiskBudget(wal_bytes=0, backlog_bytes=1, segment_bytes=1)


async def test_a_small_store_holds_appends_back_at_the_floor_and_lets_them_in_as_the_bound_grows(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "r.db")  # the defaults: a 16 MiB bound once the database is large
    store.open()
    assert store.backlog.max_bytes == BACKLOG_FLOOR and store.journal.segment_bytes == SEGMENT_FLOOR
    frame = sum(len(p) for p in encode_record(_rec(0, prompt_len=BIG)))
    fit = BACKLOG_FLOOR // frame
    gate, stalled = stall_writer(store)
    try:
        await asyncio.wait_for(store.append(_rec(0, prompt_len=BIG)), 10)
        assert await asyncio.to_thread(stalled.wait, 10), "the writer took the first record and stalled"
        for i in range(1, fit):
            await asyncio.wait_for(store.append(_rec(i, prompt_len=BIG)), 10)
        held = [asyncio.create_task(store.append(_rec(i, prompt_len=BIG))) for i in range(fit, fit + 3)]
        await asyncio.sleep(0.3)  # they cannot finish while the writer is stalled, however long this is
        assert not any(task.done() for task in held), "past the floor (far below 16 MiB) appends wait"
        assert store.stats()["journal_backlog_bytes"] <= BACKLOG_FLOOR
        store.backlog.set_max_bytes(MAX_BACKLOG_BYTES)  # what a grown database gives
        await asyncio.wait_for(asyncio.gather(*held), 10)  # in at once: the writer is still stalled
        assert store.stats()["journal_backlog"] == fit + 3, "journalled (durable) while the writer waits"
        gate.set()
        assert len(await store.read_records("s")) == fit + 3
    finally:
        gate.set()
        store.close()


async def test_the_bounds_follow_the_database_as_it_grows_and_start_there_on_reopen(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    store = SQLiteStore(path)
    store.open()
    try:
        for i in range(48):  # fresh prompts: ~7 MB that SQLite must keep
            await store.append(_fresh_rec(f"s{i % 4}", i // 4, 40_000))
        await store.caught_up()
        for _ in range(300):  # the checkpointer copies the WAL into the file within a few ticks
            if path.stat().st_size > 4 * MB:
                break
            await asyncio.sleep(0.1)
        for _ in range(50):  # the checkpointer may still be growing the file: read a size it held throughout
            db = path.stat().st_size
            wal = store._follow_budget()
            if path.stat().st_size == db:
                break
            await asyncio.sleep(0.1)
        assert db > 4 * MB
        want = store.disk_budget.at(db)
        assert (wal, store.backlog.max_bytes, store.journal.segment_bytes) == \
            (want.wal_bytes, want.backlog_bytes, want.segment_bytes)
        assert store.backlog.max_bytes > BACKLOG_FLOOR and store.journal.segment_bytes > SEGMENT_FLOOR
    finally:
        store.close()
    again = SQLiteStore(path)
    again.open()
    try:
        assert again.backlog.max_bytes >= int(BACKLOG_SHARE * db), "a reopened store starts at its size's bounds"
        assert again.backlog.max_bytes <= MAX_BACKLOG_BYTES
        assert len(await again.read_records("s0")) == 12
    finally:
        again.close()


async def test_the_wal_of_a_small_store_is_reset_below_the_configured_limit(tmp_path: Path) -> None:
    """A few MB written, then quiet: the WAL (under 8 MiB, the configured limit) must still be reset,
    since it is far more than a share of a database this small."""
    path = tmp_path / "r.db"
    store = SQLiteStore(path)
    store.open()
    wal = tmp_path / "r.db-wal"
    try:
        for i in range(24):
            await store.append(_fresh_rec(f"s{i % 4}", i // 4, 40_000))
        await store.caught_up()
        # every page of the database went through the WAL, which nothing else shrinks below 8 MiB
        assert path.stat().st_size + wal.stat().st_size > 3 * WAL_FLOOR, "too little written: it could not fail"
        # the bound at this size: a share of the database, at least the floor -- far under the 8 MiB
        # configured. A reset that came while the writes went on leaves the frames written after it,
        # which is right as long as they stay under this bound (under a CPU hog: 266 frames, 1.05 MiB)
        bound = store.disk_budget.at(path.stat().st_size).wal_bytes
        assert bound < store.disk_budget.wal_bytes // 2, "the bound must be the small store's, not the configured one"
        smallest = wal.stat().st_size
        for _ in range(300):  # up to ~30 s for the checkpointer to get a turn on a busy machine
            if smallest < bound:
                break
            await asyncio.sleep(0.1)
            smallest = min(smallest, wal.stat().st_size if wal.exists() else 0)
        assert smallest < bound, f"the WAL stayed at {smallest} bytes for a {path.stat().st_size}-byte database"
    finally:
        store.close()
