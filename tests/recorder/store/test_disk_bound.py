"""The store's footprint on disk stays bounded while it is written to without pause.

Before a clean stop, nothing used to shrink the SQLite write-ahead log (a PASSIVE checkpoint
cannot reset a log that the writer keeps appending to) nor the journal's open segment (deleted
only once a 64 MB segment was full and indexed). These tests write continuously, with a reader
taking snapshots throughout, and fail if either file keeps growing with what was written.
"""

from __future__ import annotations

import asyncio
import threading
from array import array
from pathlib import Path

from openenv_harness.recorder.store import PendingRecord, SQLiteStore


def _rec(session: str, index: int, prompt_len: int) -> PendingRecord:
    # a fresh prompt every call (nothing shared): every record writes its whole prompt to SQLite
    prompt = array("I", [(index * 7919 + i * 31) % 60000 for i in range(prompt_len)])
    return PendingRecord(
        session_id=session, call_index=index, call_kind="agent", status="ok",
        request={"model": "m", "messages": [{"role": "user", "content": f"question {index} " * 50}]},
        response={"id": f"c{index}", "choices": [{"index": 0, "finish_reason": "stop",
                                                  "message": {"role": "assistant", "content": "ok"}}]},
        prompt_ids=prompt, completion_ids=array("I", [index % 50000, 2]), logprobs=array("d", [-0.5, -0.25]),
        completion_tokens=None, trainable=True,
        metadata={"node_id": f"{session}/{index}", "call_index": index, "request_digest": f"d{index}",
                  "status": "ok"},
        created_at=1.0,
    )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


async def test_wal_and_journal_stay_bounded_under_continuous_writes_and_readers(tmp_path: Path) -> None:
    wal_limit = 1 << 20
    store = SQLiteStore(tmp_path / "r.db", wal_limit_bytes=wal_limit, journal_segment_bytes=1 << 20)
    store.open()
    wal, journal_dir = tmp_path / "r.db-wal", tmp_path / "r.db.records-log"
    largest_wal = largest_journal = 0
    stop = threading.Event()

    def reader() -> None:  # snapshots taken and released all the time, as the admin API's reads do
        while not stop.is_set():
            store._read_records("s0", 0)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    written = 0
    try:
        for i in range(1500):  # ~24 MB of prompts, far beyond both bounds
            await store.append(_rec(f"s{i % 4}", i // 4, 4000))
            written += 4000 * 4
            if i % 25 == 0:
                await asyncio.sleep(0.02)  # lets the checkpointer and the reader in
                largest_wal = max(largest_wal, _size(wal))
                largest_journal = max(largest_journal, sum(_size(p) for p in journal_dir.glob("records-*.log")))
    finally:
        stop.set()
        thread.join(timeout=30)
        await store.caught_up()
        store.close()
    assert written > 20 * wal_limit
    # generous margins: the bound is checked a few times a second, and this machine may be busy
    assert largest_wal < 8 * wal_limit, f"WAL reached {largest_wal} bytes for a {wal_limit}-byte bound"
    assert largest_journal < 8 * (1 << 20), f"journal reached {largest_journal} bytes"
