"""The record journal: the durability point of ``append``, and what ``open`` does with it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
from array import array
from pathlib import Path

import pytest

from openenv_harness.recorder.store import PendingRecord, SQLiteStore
from openenv_harness.recorder.store.journal import Journal, JournalError, decode_record, encode_record

from writer_stall import stall_writer


def _rec(index: int, *, prompt_len: int = 300, session: str = "s") -> PendingRecord:
    prompt = array("I", [(index * 7919 + i) % 50000 for i in range(prompt_len)])
    return PendingRecord(
        session_id=session, call_index=index, call_kind="agent", status="ok",
        request={"model": "m", "messages": [{"role": "user", "content": f"q{index}"}]},
        response={"id": f"c{index}", "choices": [{"index": 0, "finish_reason": "stop",
                                                  "message": {"role": "assistant", "content": "ok"}}]},
        prompt_ids=prompt, completion_ids=array("I", [index, 1]), logprobs=array("d", [-0.25, -1e-9]),
        completion_tokens=None, trainable=True,
        metadata={"node_id": f"{session}/{index}", "call_index": index, "request_digest": f"d{index}", "status": "ok"},
        created_at=1.5,
    )


def test_a_frame_decodes_to_the_record_it_encodes() -> None:
    rec = _rec(3)
    rec.completion_tokens = ["token_id:3", "token_id:1"]
    back = decode_record(b"".join(encode_record(rec)))
    assert back.prompt_ids == rec.prompt_ids and back.completion_ids == rec.completion_ids
    assert back.logprobs == rec.logprobs and back.request == rec.request and back.response == rec.response
    assert (back.metadata, back.completion_tokens, back.created_at) == (rec.metadata, rec.completion_tokens, 1.5)

    failed = _rec(4)
    failed.prompt_ids = failed.completion_ids = failed.logprobs = None
    failed.request_json = b'{"messages":[{"role":"user","content":"q4"}],"model":"m"}'
    back = decode_record(b"".join(encode_record(failed)))
    assert back.prompt_ids is None and back.completion_ids is None and back.logprobs is None
    assert back.request_json == failed.request_json, "the agent's own bytes are what the journal keeps"
    with pytest.raises(ValueError, match="trailing bytes"):
        decode_record(b"".join(encode_record(failed)) + b"x")


def test_recover_keeps_whole_frames_and_drops_a_torn_tail(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j")
    journal.start(1)
    for seq in (1, 2, 3):
        journal.append(seq, [f"payload {seq}".encode()])
    journal.close(remove=False)
    (segment,) = journal.segments()
    whole = segment.read_bytes()
    segment.write_bytes(whole[:-5])  # killed in the middle of writing frame 3
    assert list(Journal(tmp_path / "j").recover()) == [(1, b"payload 1"), (2, b"payload 2")]
    segment.write_bytes(whole + b"\0" * 64)  # zeros past the end (a file system after power loss)
    assert [seq for seq, _ in Journal(tmp_path / "j").recover()] == [1, 2, 3]


def test_segments_rotate_and_go_once_indexed(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j", segment_bytes=100)
    journal.start(1)
    for seq in range(1, 7):
        journal.append(seq, [b"x" * 80])
    assert len(journal.segments()) == 6, "a segment past its size takes no further frame"
    journal.release(3)
    assert [p.name for p in journal.segments()] == [f"records-{s:020d}.log" for s in (4, 5, 6)]
    journal.close(remove=True)
    assert journal.segments() == []
    with pytest.raises(JournalError, match="closed"):
        journal.append(7, [b"late"])


def test_a_failed_write_leaves_no_partial_frame(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = Journal(tmp_path / "j")
    journal.start(1)
    journal.append(1, [b"first"])

    def disk_full(fd: int, parts: list[bytes]) -> int:
        os.write(fd, parts[0][:7])  # part of a header reaches the file, then the disk is full
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "writev", disk_full)
    with pytest.raises(JournalError, match="No space left"):
        journal.append(2, [b"second"])
    monkeypatch.undo()
    journal.append(3, [b"third"])
    journal.close(remove=False)
    assert list(Journal(tmp_path / "j").recover()) == [(1, b"first"), (3, b"third")]


async def test_reads_see_every_acknowledged_record_and_close_leaves_no_journal(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "r.db", journal_segment_bytes=4096)
    store.open()
    seqs = await asyncio.gather(*(store.append(_rec(i)) for i in range(40)))
    assert sorted(seqs) == list(range(1, 41))
    got = await store.read_records("s")  # reads wait for the writer: nothing acknowledged is missing
    assert [e["metadata"]["call_index"] for e in got] == sorted(range(40), key=lambda i: seqs[i])
    assert len(store.journal.segments()) <= 2, "indexed segments are deleted as the writer commits"
    store.close()
    assert store.journal.segments() == []


async def test_a_record_the_writer_failed_is_indexed_at_the_next_open(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    store = SQLiteStore(path)
    store.open()
    real = store._index_ops._op_append

    def flaky(conn, item):
        if item[1].call_index == 1:
            raise OSError("simulated I/O error")
        return real(conn, item)

    store._index_ops._op_append = flaky  # type: ignore[method-assign]
    for i in range(3):
        await store.append(_rec(i))
    assert [e["metadata"]["call_index"] for e in await store.read_records("s")] == [0, 2]
    assert store.stats()["journal_unindexed"] == 1
    store.close()
    assert store.journal.segments(), "the journal keeps what SQLite does not have"

    again = SQLiteStore(path)
    again.open()
    got = await again.read_records("s")
    assert [e["metadata"]["call_index"] for e in got] == [0, 1, 2]
    assert got[1]["prompt_token_ids"] == _rec(1).prompt_ids.tolist()
    assert again.load_sessions() == [] and again.stats()["journal_unindexed"] == 0
    again.close()
    assert again.journal.segments() == []


_CHILD = textwrap.dedent("""
    import asyncio, sys, time
    sys.path.insert(0, {tests!r})
    from openenv_harness.recorder.store import SQLiteStore
    from openenv_harness.recorder.store.index_ops import IndexOps
    from test_journal import _rec

    def stalled(self, conn, batch):  # the writer never gets to commit these
        time.sleep(3600)
    IndexOps.run_batch = stalled

    async def main():
        store = SQLiteStore({db!r})
        store.open()
        for i in range(5):
            await store.append(_rec(i, prompt_len=2000))
        print("acked", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
""")


def test_sigkill_before_sqlite_commits_loses_no_acknowledged_record(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    child = subprocess.Popen([sys.executable, "-c", _CHILD.format(tests=str(Path(__file__).parent), db=str(db))],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "acked", child.stderr.read() if child.stderr else ""
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)

    store = SQLiteStore(db)
    store.open()
    try:
        got = asyncio.run(store.read_records("s"))
        assert [e["metadata"]["call_index"] for e in got] == [0, 1, 2, 3, 4]
        assert [e["prompt_token_ids"] for e in got] == [_rec(i, prompt_len=2000).prompt_ids.tolist() for i in range(5)]
        assert [e["metadata"]["seq"] for e in got] == [1, 2, 3, 4, 5]
        assert asyncio.run(_next_seq(store)) == 6, "sequence numbers go on after the recovered ones"
    finally:
        store.close()


async def _next_seq(store: SQLiteStore) -> int:
    return await store.append(_rec(9))


async def test_appends_wait_while_the_writer_is_far_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from openenv_harness.recorder.store import sqlite as store_sqlite

    monkeypatch.setattr(store_sqlite, "_MAX_BACKLOG", 4)
    store = SQLiteStore(tmp_path / "r.db")
    store.open()
    gate, stalled = stall_writer(store)
    try:
        first = asyncio.create_task(store.append(_rec(0)))
        assert await asyncio.to_thread(stalled.wait, 10), "the writer took the first record and stalled"
        appends = [asyncio.create_task(store.append(_rec(i))) for i in range(1, 13)]
        await asyncio.sleep(0.3)
        assert first.done(), "journalled: durable without waiting for the writer"
        assert [task.done() for task in appends] == [True] * 4 + [False] * 8, \
            "past a backlog of 4, appends wait for the writer to catch up"
        assert store.stats()["journal_backlog"] == 13, \
            "the held ones are journalled all the same: durable, only their replies wait"
        gate.set()
        seqs = await asyncio.wait_for(asyncio.gather(*appends), 30)
        assert seqs == list(range(2, 14))
        assert len(await store.read_records("s")) == 13
    finally:
        gate.set()
        store.close()


async def test_one_failing_record_in_a_batch_loses_only_itself(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "r.db")
    store.open()
    gate, stalled = threading.Event(), threading.Event()
    real = store._index_ops._op_append

    def flaky(conn, item):
        if item[1].call_index == 0:
            stalled.set()
            gate.wait(30)
        if item[1].call_index == 2:
            raise OSError("simulated I/O error")
        return real(conn, item)

    store._index_ops._op_append = flaky  # type: ignore[method-assign]
    try:
        await store.append(_rec(0, prompt_len=500))
        assert await asyncio.to_thread(stalled.wait, 10)
        # queued while the writer is stalled: they are indexed together, in one batch
        chain = [_rec(i, prompt_len=500) for i in range(1, 5)]
        for i, rec in enumerate(chain):  # a growing conversation, so records are stored as deltas
            rec.prompt_ids = _rec(0, prompt_len=500).prompt_ids + array("I", range(100 * (i + 1)))
            await store.append(rec)
        gate.set()
        got = await store.read_records("s")
        assert [e["metadata"]["call_index"] for e in got] == [0, 1, 3, 4]
        assert [e["prompt_token_ids"] for e in got[1:]] == [chain[i].prompt_ids.tolist() for i in (0, 2, 3)]
        assert store.stats()["journal_unindexed"] == 1
    finally:
        gate.set()
        store.close()


def test_a_second_recorder_on_the_same_store_is_refused(tmp_path: Path) -> None:
    first = SQLiteStore(tmp_path / "r.db")
    first.open()
    seq = asyncio.run(first.append(_rec(0)))
    second = SQLiteStore(tmp_path / "r.db")
    with pytest.raises(JournalError, match=rf"in use by another recorder \(pid {os.getpid()}\)"):
        second.open()
    assert asyncio.run(first.read_records("s"))[0]["metadata"]["seq"] == seq, "the first one is untouched"
    first.close()
    third = SQLiteStore(tmp_path / "r.db")
    third.open()  # free again once the first has closed
    assert [e["metadata"]["call_index"] for e in asyncio.run(third.read_records("s"))] == [0]
    third.close()


async def test_full_synchronous_fsyncs_each_record_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(threading.current_thread().name)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store = SQLiteStore(tmp_path / "r.db", synchronous="FULL")
    store.open()
    try:
        loop_thread = threading.current_thread().name
        before = len(synced)
        seqs = [await store.append(_rec(i)) for i in range(3)]
        journal_syncs = synced[before:]
        assert len(journal_syncs) >= 3, "every journalled record is fsync-ed before append returns"
        assert loop_thread not in journal_syncs, "no fsync on the event loop's thread"
        assert [e["metadata"]["seq"] for e in await store.read_records("s")] == seqs
    finally:
        store.close()


_SESSION_CHILD = textwrap.dedent("""
    import asyncio, sys, time
    sys.path.insert(0, {tests!r})
    from openenv_harness.recorder.store import SessionRow, SQLiteStore
    from openenv_harness.recorder.store.index_ops import IndexOps
    from test_journal import _rec

    def stalled(self, conn, batch):  # the writer never gets to commit anything
        time.sleep(3600)
    IndexOps.run_batch = stalled

    async def main():
        store = SQLiteStore({db!r})
        store.open()
        row = SessionRow("s", "digest-s", "open", 1.0, {{"harness": "pi"}})
        await store.put_session(row)  # returns once journalled: the stalled writer is not waited for
        await store.append(_rec(0))
        row.status, row.closed_at = "closed", 2.0
        await store.put_session(row)
        print("acked", flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
""")


def test_a_session_row_is_durable_once_journalled_without_waiting_for_the_writer(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    child = subprocess.Popen(
        [sys.executable, "-c", _SESSION_CHILD.format(tests=str(Path(__file__).parent), db=str(db))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "acked", child.stderr.read() if child.stderr else ""
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)

    store = SQLiteStore(db)
    store.open()
    try:
        (row,) = store.load_sessions()
        assert (row.session_id, row.secret_digest, row.status, row.closed_at) == ("s", "digest-s", "closed", 2.0)
        assert row.spec == {"harness": "pi"} and row.next_call_index == 1
        assert [e["metadata"]["seq"] for e in asyncio.run(store.read_records("s"))] == [2]
    finally:
        store.close()
    assert store.journal.segments() == []
