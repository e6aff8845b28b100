"""What a reply may wait on in the store: nothing while the indexer's backlog is within its bounds,
and past them only the indexer's progress -- never the index process's lazy acknowledgement timer.

The index process acknowledges in batches when nobody waits (``index_child.ACK_EVERY`` operations
or ``ACK_AFTER_S`` seconds). Here it runs with both set out of reach (a million operations, an
hour), so a reply that waited on that timer would miss the test's deadline by an hour: no timing
is measured, the outcome is all or nothing.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from pathlib import Path

import pytest

from openenv_harness.recorder.store import SQLiteStore
from openenv_harness.recorder.store import indexer as indexer_module
from openenv_harness.recorder.store import sqlite as sqlite_module
from openenv_harness.recorder.store.journal import encode_record

from test_journal import _rec

PROMPT = 4000  # ids: a frame of ~16 KB
DEADLINE_S = 60  # far below the lazy timer's hour, far above any indexing here


@pytest.fixture
def lazy_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stores opened in this test get an index process that acknowledges only when asked to."""
    wrapper = tmp_path / "python-lazy-acks"
    code = ("import sys; from openenv_harness.recorder.store import index_child as c; "
            "c.ACK_EVERY = 10 ** 6; c.ACK_AFTER_S = 3600.0; c.main(sys.argv[1:])")
    # the indexer runs ``PYTHON -m openenv_harness.recorder.store.index_child FD DB SYNC PRIORITY``
    wrapper.write_text(f"#!/bin/sh\nshift 2\nexec {sys.executable} -c '{code}' \"$@\"\n")
    wrapper.chmod(0o755)
    monkeypatch.setattr(sqlite_module, "make_indexer", functools.partial(indexer_module.make_indexer, python=str(wrapper)))


def _frame_bytes(index: int) -> int:
    return sum(len(p) for p in encode_record(_rec(index, prompt_len=PROMPT)))


async def test_appends_within_the_bounds_wait_on_no_acknowledgement(tmp_path: Path, lazy_child: None) -> None:
    store = SQLiteStore(tmp_path / "r.db", indexer="process")
    store.open()
    try:
        for i in range(30):  # within the record bound (64) and the byte bound (1 MiB at least)
            await asyncio.wait_for(store.append(_rec(i, prompt_len=PROMPT)), DEADLINE_S)
        assert store.stats()["journal_backlog"] == 30, "nothing was acknowledged, and no reply waited for it"
        await asyncio.wait_for(store.caught_up(), DEADLINE_S)  # a reader's barrier is acknowledged at once
        assert len(await store.read_records("s")) == 30
    finally:
        store.close()


async def test_a_reply_held_by_the_byte_bound_goes_as_soon_as_the_frames_ahead_are_indexed(
        tmp_path: Path, lazy_child: None) -> None:
    """One agent calling in a chain (each call after the previous reply), its frames past the bound
    every few calls: each held reply goes once the index process has indexed what is ahead of it."""
    bound = int(_frame_bytes(0) * 2.5)  # two frames fit; the third waits for room
    store = SQLiteStore(tmp_path / "r.db", indexer="process", max_backlog_bytes=bound)
    store.open()
    try:
        for i in range(20):
            assert await asyncio.wait_for(store.append(_rec(i, prompt_len=PROMPT)), DEADLINE_S) == i + 1
        assert store.stats()["journal_backlog_bytes"] <= bound
        got = await store.read_records("s")
        assert [e["metadata"]["call_index"] for e in got] == list(range(20))
    finally:
        store.close()


async def test_replies_held_by_the_record_bound_go_as_soon_as_the_backlog_is_back_within_it(
        tmp_path: Path, lazy_child: None) -> None:
    store = SQLiteStore(tmp_path / "r.db", indexer="process")
    store.open()
    try:
        count = indexer_module.MAX_BACKLOG + 20  # the last twenty are journalled past the record bound
        seqs = await asyncio.wait_for(
            asyncio.gather(*(store.append(_rec(i, session=f"s{i % 4}")) for i in range(count))), DEADLINE_S)
        assert sorted(seqs) == list(range(1, count + 1))
        assert sum([len(await store.read_records(f"s{k}")) for k in range(4)]) == count
    finally:
        store.close()
