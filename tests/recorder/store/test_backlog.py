"""The indexer's backlog is bounded in bytes as well as in records: past the byte bound an append
waits for room before its frame is journalled (its reply follows the write, as always), and goes on
once the indexer catches up, losing nothing; however many append at once, the unindexed journal
stays within the bound."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from openenv_harness.recorder.store import SQLiteStore
from openenv_harness.recorder.store.backlog import AppendBacklog
from openenv_harness.recorder.store.journal import encode_record

from test_journal import _rec
from writer_stall import stall_writer

PROMPT = 4000  # ids: a frame of ~16 KB, so a few frames pass a bound far below the 64-record one


def _frame_bytes(index: int) -> int:
    return sum(len(p) for p in encode_record(_rec(index, prompt_len=PROMPT)))


async def test_appends_past_the_byte_bound_wait_for_the_indexer_and_resume_when_it_catches_up(tmp_path: Path) -> None:
    bound = int(_frame_bytes(0) * 2.5)  # two frames fit; the third is over
    store = SQLiteStore(tmp_path / "r.db", max_backlog_bytes=bound)
    store.open()
    gate, stalled = stall_writer(store)
    try:
        await asyncio.wait_for(store.append(_rec(0, prompt_len=PROMPT)), 10)  # 1 frame: within the bound
        assert await asyncio.to_thread(stalled.wait, 10), "the writer took the first record and stalled"
        await asyncio.wait_for(store.append(_rec(1, prompt_len=PROMPT)), 10)  # 2 frames: within
        held = [asyncio.create_task(store.append(_rec(i, prompt_len=PROMPT))) for i in range(2, 8)]
        gone = asyncio.create_task(store.append(_rec(99, prompt_len=PROMPT)))  # its agent hangs up while it waits
        await asyncio.sleep(0.3)  # they cannot finish while the writer is stalled, however long this is
        assert not any(task.done() for task in held), "past the byte bound (far below 64 records) they wait"
        stats = store.stats()
        assert stats["journal_backlog"] == 2, "waiting for room: not journalled yet (and not answered)"
        assert stats["journal_backlog_bytes"] == _frame_bytes(0) + _frame_bytes(1) <= bound
        assert store.backlog.waiting() == 7
        gone.cancel()
        gate.set()
        seqs = await asyncio.wait_for(asyncio.gather(*held), 30)
        assert seqs == list(range(3, 9)), "first come, first served"
        got = await store.read_records("s")
        assert [e["prompt_token_ids"] for e in got] == [_rec(i, prompt_len=PROMPT).prompt_ids.tolist() for i in range(8)]
        assert store.stats()["journal_backlog_bytes"] == 0, "a cancelled waiter leaves no reservation behind"
        assert await asyncio.wait_for(store.append(_rec(8, prompt_len=PROMPT)), 10) == 9
    finally:
        gate.set()
        store.close()


async def test_a_held_back_index_process_killed_meanwhile_loses_nothing(tmp_path: Path) -> None:
    """The real index process, stopped (as good as starved), then killed while replies wait on it:
    its replacement indexes every journalled record and the waiting replies go out."""
    bound = int(_frame_bytes(0) * 3.5)
    store = SQLiteStore(tmp_path / "r.db", indexer="process", max_backlog_bytes=bound)
    store.open()
    try:
        pid = store._queue.indexer.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            for i in range(3):
                await asyncio.wait_for(store.append(_rec(i, prompt_len=PROMPT)), 10)
            held = [asyncio.create_task(store.append(_rec(i, prompt_len=PROMPT))) for i in range(3, 10)]
            await asyncio.sleep(0.3)  # a stopped index process acknowledges nothing, however long this is
            assert not any(task.done() for task in held)
            assert store.stats()["journal_backlog"] == 3, "the journal holds no more than the bound"
        finally:
            os.kill(pid, signal.SIGKILL)  # delivered to a stopped process too
        assert await asyncio.wait_for(asyncio.gather(*held), 60) == list(range(4, 11))
        got = await store.read_records("s")
        assert [e["metadata"]["call_index"] for e in got] == list(range(10)), "nothing lost, nothing doubled"
        assert got[-1]["prompt_token_ids"] == _rec(9, prompt_len=PROMPT).prompt_ids.tolist()
        assert store._queue.indexer.pid != pid and store.stats()["journal_backlog_bytes"] == 0
    finally:
        store.close()


async def test_a_record_larger_than_the_bound_waits_only_for_itself(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "r.db", max_backlog_bytes=1024)  # smaller than any frame here
    store.open()
    try:
        seqs = [await asyncio.wait_for(store.append(_rec(i, prompt_len=PROMPT)), 30) for i in range(3)]
        assert seqs == [1, 2, 3]
        assert len(await store.read_records("s")) == 3
    finally:
        store.close()


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        AppendBacklog(max_records=64, max_bytes=0, records=lambda: 0)


async def test_many_appends_at_once_never_take_the_journal_past_the_bound(tmp_path: Path) -> None:
    """Sixty-four agents' records arriving together: each waits for room, none is journalled beyond it."""
    bound = int(_frame_bytes(0) * 4.5)
    store = SQLiteStore(tmp_path / "r.db", max_backlog_bytes=bound)
    store.open()
    peak = 0
    real = store._index_ops._op_append

    def watched(conn, item):
        nonlocal peak
        peak = max(peak, store.backlog.bytes)
        return real(conn, item)

    store._index_ops._op_append = watched  # type: ignore[method-assign]
    try:
        recs = [_rec(i, prompt_len=PROMPT, session=f"s{i % 8}") for i in range(64)]
        await asyncio.wait_for(asyncio.gather(*(store.append(r) for r in recs)), 60)
        assert 0 < peak <= bound
        got = [e for n in range(8) for e in await store.read_records(f"s{n}")]
        assert sorted(e["metadata"]["call_index"] for e in got) == list(range(64))
    finally:
        store.close()
