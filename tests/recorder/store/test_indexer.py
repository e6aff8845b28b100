"""Where records are indexed: a child process gives the same store as a thread, and survives its
own death without losing or doubling a record."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from openenv_harness.recorder.store import SQLiteStore
from openenv_harness.recorder.store import index_child, index_priority
from openenv_harness.recorder.store import indexer as indexer_module
from openenv_harness.recorder.store.base import SessionRow
from openenv_harness.recorder.store.connection import connect
from openenv_harness.recorder.store.index_ops import IndexOps
from openenv_harness.recorder.store.indexer import IndexerFailed
from openenv_harness.recorder.store.journal import Journal, journal_directory

from test_journal import _rec


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


async def _fill(store: SQLiteStore, first: int, count: int) -> list[int]:
    return list(await asyncio.gather(*(store.append(_rec(i, session=f"s{i % 3}")) for i in range(first, first + count))))


async def test_a_process_indexer_stores_exactly_what_a_thread_indexer_stores(tmp_path: Path) -> None:
    got = {}
    for kind in ("thread", "process"):
        store = SQLiteStore(tmp_path / f"{kind}.db", indexer=kind)
        store.open()
        await store.put_session(SessionRow(session_id="s0", secret_digest="d0", status="open", created_at=1.0,
                                           spec={"harness": "pi"}))
        await _fill(store, 0, 30)
        await store.forget("s1")
        await _fill(store, 30, 10)
        got[kind] = ([await store.read_records(f"s{n}") for n in range(3)], store.load_sessions(),
                     store.stats()["records_written"])
        store.close()
        assert store.journal.segments() == [], "everything indexed: the journal is gone"
    assert got["process"] == got["thread"]
    records, sessions, written = got["process"]
    assert sum(len(r) for r in records) == 40 == written
    assert [(s.session_id, s.next_call_index) for s in sessions] == [("s0", 40)]  # s0's last call is 39
    assert records[0][0]["prompt_token_ids"] == _rec(0).prompt_ids.tolist()


async def test_a_killed_index_process_is_replaced_and_nothing_is_lost_or_doubled(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "r.db", indexer="process")
    store.open()
    try:
        await _fill(store, 0, 20)
        first = store._queue.indexer.pid
        assert first is not None and _alive(first)
        os.kill(first, signal.SIGKILL)
        await _fill(store, 20, 40)  # appends go on while the child is gone and while it is replaced
        got = [e for n in range(3) for e in await store.read_records(f"s{n}")]
        assert sorted(e["metadata"]["call_index"] for e in got) == list(range(60))
        assert store._queue.indexer.pid not in (None, first) and _alive(store._queue.indexer.pid)
        assert store.stats()["journal_unindexed"] == 0
    finally:
        store.close()


async def test_an_index_process_that_keeps_dying_fails_the_store_and_the_journal_keeps_all(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(indexer_module, "MAX_RESTARTS", 1)
    path = tmp_path / "r.db"
    store = SQLiteStore(path, indexer="process")
    store.open()
    await _fill(store, 0, 5)
    await store.caught_up()
    store._queue.indexer.python = "/bin/false"  # every replacement exits at once
    os.kill(store._queue.indexer.pid, signal.SIGKILL)
    await _fill(store, 5, 5)  # journalled (durable) before the failure is known
    deadline = time.monotonic() + 20
    while store._queue.indexer.failed is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert store._queue.indexer.failed and "died" in store._queue.indexer.failed
    with pytest.raises(IndexerFailed):
        await store.append(_rec(99))  # refused before it is journalled: the agent's retry is no twin
    store.close()
    assert store.journal.segments(), "what was not indexed stays in the journal"

    again = SQLiteStore(path, indexer="process")
    again.open()
    try:
        got = [e for n in range(3) for e in await again.read_records(f"s{n}")]
        assert sorted(e["metadata"]["call_index"] for e in got) == list(range(10))
    finally:
        again.close()


def test_the_index_process_ends_with_its_recorder(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r})
        from openenv_harness.recorder.store import SQLiteStore
        store = SQLiteStore({str(tmp_path / "r.db")!r}, indexer="process")
        store.open()
        store.caught_up_sync()  # the index process is up and serving (a starting one at nice +10
        print(store._queue.indexer.pid, flush=True)  # takes long to import on a loaded machine)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(proc.stdout.readline())
        assert _alive(child)
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 60  # it needs a turn of a core to see the end of its pipe
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the index process outlived its recorder"
    finally:
        proc.kill()


async def test_appends_reach_the_index_process_on_the_loops_next_turn_in_one_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = SQLiteStore(tmp_path / "r.db", indexer="process")
    store.open()
    sent: list[list[tuple]] = []
    real_send = store._queue.indexer._send
    monkeypatch.setattr(store._queue.indexer, "_send", lambda messages: (sent.append(messages), real_send(messages)))
    try:
        for i in range(5):  # no await suspends here: the loop does not turn between these appends
            await store.append(_rec(i))
        assert sent == [], "nothing crosses to the child while the calls that journalled are still running"
        await asyncio.sleep(0)
        assert [[m[0] for m in batch] for batch in sent] == [[1, 2, 3, 4, 5]], "one message, in order"
        sent.clear()
        await store.append(_rec(5))
        await store.caught_up()  # someone waits: sent at once, behind the append queued before it
        assert [[m[1] for m in batch] for batch in sent] == [["append", "nothing"]]
        assert [e["metadata"]["call_index"] for e in await store.read_records("s")] == list(range(6))
    finally:
        store.close()


async def test_a_child_killed_with_appends_still_in_the_outbox_gets_them_once(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "r.db", indexer="process")
    store.open()
    try:
        await _fill(store, 0, 10)
        await store.caught_up()
        first = store._queue.indexer.pid
        for i in range(10, 20):
            await store.append(_rec(i, session=f"s{i % 3}"))  # queued for the next turn
        os.kill(first, signal.SIGKILL)
        await asyncio.sleep(0)  # the flush may hit the dead child's socket; the restart resends
        got = [e for n in range(3) for e in await store.read_records(f"s{n}")]
        assert sorted(e["metadata"]["call_index"] for e in got) == list(range(20))
        assert store.stats()["journal_unindexed"] == 0
    finally:
        store.close()


def _scheduling(pid: int) -> tuple[int, int]:
    return os.sched_getscheduler(pid), os.getpriority(os.PRIO_PROCESS, pid)


async def _settled(pid: int, expected: tuple[int, int]) -> tuple[int, int]:
    """The child applies its priority as it starts: wait for it (or time out with what it has)."""
    deadline = time.monotonic() + 10
    while (got := _scheduling(pid)) != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return got


@pytest.mark.parametrize("priority", ["normal", "low", "idle"])
async def test_the_index_process_runs_at_the_priority_asked_for(tmp_path: Path, priority: str) -> None:
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    expected = {"normal": (os.SCHED_OTHER, ours), "low": (os.SCHED_OTHER, min(19, ours + index_priority.NICENESS)),
                "idle": (os.SCHED_IDLE, ours)}[priority]
    store = SQLiteStore(tmp_path / "r.db", indexer="process", index_priority=priority)
    store.open()
    try:
        assert await _settled(store._queue.indexer.pid, expected) == expected
        await store.append(_rec(0))
        await store.caught_up()
        assert len(await store.read_records("s")) == 1
    finally:
        store.close()
    assert _scheduling(os.getpid()) == (os.SCHED_OTHER, ours), "the recorder itself is untouched"
    with pytest.raises(ValueError, match="index_priority"):
        SQLiteStore(tmp_path / "x.db", indexer="process", index_priority="realtime")


@contextlib.asynccontextmanager
async def _idle_store(tmp_path: Path) -> AsyncIterator[tuple[SQLiteStore, int]]:
    """A store whose index process runs at ``idle``, once it has lowered itself; and that process."""
    store = SQLiteStore(tmp_path / "r.db", indexer="process", index_priority="idle")
    store.open()
    try:
        pid = store._queue.indexer.pid
        assert await _settled(pid, _IDLE) == _IDLE
        yield store, pid
    finally:
        store.close()


_OURS = os.getpriority(os.PRIO_PROCESS, 0)
_IDLE, _NORMAL = (os.SCHED_IDLE, _OURS), (os.SCHED_OTHER, _OURS)


async def test_an_idle_index_process_runs_at_normal_priority_while_someone_waits(tmp_path: Path) -> None:
    idle, normal = _IDLE, _NORMAL
    async with _idle_store(tmp_path) as (store, pid):
        # another writer holds SQLite's write lock: the child's transaction for the barrier blocks,
        # with the barrier's waiter known to it
        blocker = sqlite3.connect(store.path, isolation_level=None, timeout=30)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            barrier = asyncio.ensure_future(store.caught_up())
            assert await _settled(pid, normal) == normal, "someone waits: indexing runs at normal priority"
            assert not barrier.done()
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        await asyncio.wait_for(barrier, 30)
        assert await _settled(pid, idle) == idle, "caught up: back to idle priority"
        await store.append(_rec(0))
        await store.caught_up()
        assert len(await store.read_records("s")) == 1


async def test_the_recorder_raises_an_idle_index_process_that_cannot_run(tmp_path: Path) -> None:
    """A process under SCHED_IDLE on busy cores may not run for a long while: the recorder raises it
    when a batch is queued or someone waits, rather than leaving it to notice."""
    ours, idle, normal = _OURS, _IDLE, _NORMAL
    async with _idle_store(tmp_path) as (store, pid):
        os.kill(pid, signal.SIGSTOP)  # as good as never scheduled
        try:
            for i in range(indexer_module.CHILD_MAX_BATCH - 1):
                await store.append(_rec(i))
            await asyncio.sleep(0.05)  # the records go to the child on the loop's next turn
            assert _scheduling(pid) == idle, "less than a batch queued: left idle"
            await store.append(_rec(indexer_module.CHILD_MAX_BATCH - 1))
            await asyncio.sleep(0.05)
            low = (os.SCHED_OTHER, min(19, ours + index_priority.NICENESS))
            assert _scheduling(pid) == low, "a batch queued: raised by the recorder, still after the calls"
        finally:
            os.kill(pid, signal.SIGCONT)
        await asyncio.wait_for(store.caught_up(), 30)
        assert await _settled(pid, idle) == idle, "caught up: it lowers itself again"
        os.kill(pid, signal.SIGSTOP)
        try:
            barrier = asyncio.ensure_future(store.caught_up())
            await asyncio.sleep(0.05)
            assert _scheduling(pid) == normal, "someone waits: raised by the recorder"
        finally:
            os.kill(pid, signal.SIGCONT)
        await asyncio.wait_for(barrier, 30)
        assert len(await store.read_records("s")) == indexer_module.CHILD_MAX_BATCH


class _Spy(index_priority.Scheduling):
    def __init__(self) -> None:
        super().__init__("normal")
        self.calls: list[str] = []

    def behind(self) -> None:
        self.calls.append("behind")

    def caught_up(self) -> None:
        self.calls.append("caught_up")


def test_the_index_process_says_it_is_behind_when_more_than_a_batch_is_queued(tmp_path: Path) -> None:
    SQLiteStore(tmp_path / "r.db").open()  # the schema
    ours, theirs = multiprocessing.Pipe()
    nothing = [(token, "nothing", None, False, False) for token in range(1, 2 * indexer_module.CHILD_MAX_BATCH + 1)]
    for i in range(0, len(nothing), indexer_module.CHILD_MAX_BATCH):
        ours.send(nothing[i : i + indexer_module.CHILD_MAX_BATCH])
    spy = _Spy()
    path = str(tmp_path / "r.db")
    db = connect(path, "NORMAL")
    journal = Journal(journal_directory(path))  # only read from, as the index process does
    worker = threading.Thread(target=index_child.serve, args=(theirs, IndexOps(), db, journal, spy))
    worker.start()
    assert ours.poll(10)
    acked = ours.recv()[0]
    while acked < len(nothing):  # acknowledged every ACK_EVERY operations
        assert ours.poll(10)
        acked = ours.recv()[0]
    deadline = time.monotonic() + 30
    while "caught_up" not in spy.calls:  # its queue is empty now: it says so before waiting
        assert time.monotonic() < deadline, spy.calls
        time.sleep(0.01)
    ours.send([(0, "stop", None, False, True)])
    worker.join(10)
    assert not worker.is_alive()
    db.close()
    assert spy.calls[0] == "behind", spy.calls  # two batches were queued before it started
    assert "caught_up" in spy.calls, "with the queue empty it said so before waiting"


def _in_thread(fn):  # policies are per thread: never change the test runner's own
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join(10)
    return out[0]


def test_idle_priority_adapts_where_allowed_and_falls_back_to_low_where_not() -> None:
    ours = os.getpriority(os.PRIO_PROCESS, 0)

    def adaptive():
        s = index_priority.Scheduling("idle")
        s.apply(leave_idle_allowed=True)
        seen = [os.sched_getscheduler(0)]
        s.behind()
        seen.append(os.sched_getscheduler(0))
        s.behind()  # already normal: nothing to do
        s.caught_up()
        seen.append(os.sched_getscheduler(0))
        return s.adaptive, seen

    assert index_priority.can_leave_idle(), "this test runs where leaving SCHED_IDLE is allowed (root)"
    assert _in_thread(adaptive) == (True, [os.SCHED_IDLE, os.SCHED_OTHER, os.SCHED_IDLE])

    def refused():
        s = index_priority.Scheduling("idle")
        s.apply(leave_idle_allowed=False)  # as where CAP_SYS_NICE and RLIMIT_NICE are missing
        s.behind()
        return s.adaptive, os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    assert _in_thread(refused) == (False, os.SCHED_OTHER, min(19, ours + index_priority.NICENESS))
    with pytest.raises(ValueError, match="priority must be one of"):
        index_priority.Scheduling("realtime")


def test_an_index_process_raised_by_the_recorder_lowers_itself_once_caught_up() -> None:
    """The recorder raises the index process from outside (``_wake_child``), without the process
    noticing it was behind: once its queue is empty it must go back to idle all the same."""

    def raised_from_outside():
        s = index_priority.Scheduling("idle")
        s.apply(leave_idle_allowed=True)
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_OTHER, os.sched_param(0))  # as the recorder does
        seen = [os.sched_getscheduler(0)]
        s.caught_up()
        seen.append(os.sched_getscheduler(0))
        return seen

    assert _in_thread(raised_from_outside) == [os.SCHED_OTHER, os.SCHED_IDLE]


async def test_pending_appends_hold_no_record_while_the_index_process_works(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "r.db", indexer="process")
    store.open()
    try:
        records = [_rec(i) for i in range(5)]
        for record in records:
            await store.append(record)
        # still unacknowledged (the child acknowledges every ACK_EVERY appends unless someone waits)
        held = [entry[0] for entry in store._queue.indexer._pending.values()]
        assert [item[1][0] for item in held] == [1, 2, 3, 4, 5]  # their sequence numbers
        assert all(item[1][1] is None for item in held), "the child reads the journal: no record is kept"
        assert all(not any(part is record for part in item[1]) for item in held for record in records)
        await store.caught_up()
        assert [e["metadata"]["call_index"] for e in await store.read_records("s")] == list(range(5))
    finally:
        store.close()
