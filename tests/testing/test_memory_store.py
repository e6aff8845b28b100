"""``MemoryStore`` (the step tests' store) answers every call of the store interface as ``SQLiteStore`` does.

The same script of appends -- ok, invalid, aborted with partial ids, failed without ids, a request
whose messages and tools the SQLite store keeps as shared blobs -- runs against both; what each
read returns, what a retry finds, what a restart recovers and a sealed session's refusal must match.
"""

from __future__ import annotations

import time
from array import array
from pathlib import Path
from typing import Any

import pytest

from openenv_harness.recorder.store.base import PendingRecord, RecordStore, SessionRow, SessionSealed
from openenv_harness.recorder.store.sqlite import SQLiteStore
from openenv_harness.testing.memory_store import MemoryStore

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]


def _record(session: str, index: int, status: str, *, digest: str, kind: str = "agent",
            ids: bool = True, partial: bool = False) -> PendingRecord:
    messages = [{"role": "user", "content": "hello"}, *({"role": "user", "content": f"turn {i}"} for i in range(index))]
    request = {"model": "m", "messages": messages, "tools": TOOLS}
    md = {"node_id": f"{session}/{index}", "call_index": index, "status": status, "request_digest": digest,
          "trainable": status == "ok", "partial": partial, "limits": {"tool_calls": index}}
    return PendingRecord(
        session_id=session, call_index=index, call_kind=kind, status=status, request=request,
        response={"id": f"r{index}", "choices": [{"message": {"role": "assistant", "content": "x"}}]} if ids else {},
        prompt_ids=array("I", range(10 + index)) if ids else None,
        completion_ids=array("I", [100 + index, 101]) if ids else None,
        logprobs=array("d", [-0.1 * (index + 1), -0.333333333333]) if ids else None,
        completion_tokens=["a", "b"] if ids else None, trainable=status == "ok", metadata=md,
        created_at=time.time())


async def _script(store: RecordStore) -> dict[str, Any]:
    store.open()
    try:
        for session in ("s1", "s2"):
            await store.put_session(SessionRow(session_id=session, secret_digest="d" + session, status="open",
                                               created_at=1.0, spec={"harness": "pi"}, state={"outcome": None}))
        seqs = [
            await store.append(_record("s1", 0, "ok", digest="a")),
            await store.append(_record("s2", 0, "ok", digest="a")),
            await store.append(_record("s1", 1, "invalid", digest="b")),
            await store.append(_record("s1", 2, "invalid", digest="c", partial=True)),
            await store.append(_record("s1", 3, "failed", digest="c", ids=False)),
            await store.append(_record("s1", 4, "ok", digest="a", kind="aux")),
        ]
        await store.caught_up()
        out: dict[str, Any] = {
            "seqs": seqs,
            "s1": await store.read_records("s1"),
            "s1_after": await store.read_records("s1", after_seq=seqs[2]),
            "s2": list(store.iter_records("s2")),
            "retry_a": await store.find_by_digest("s1", "a"),
            "retry_b": await store.find_by_digest("s1", "b"),  # invalid: never a retry's answer
            "retry_none": await store.find_by_digest("s1", "zzz"),
        }
        store.seal("s2")
        with pytest.raises(SessionSealed):
            await store.append(_record("s2", 1, "ok", digest="x"))
        out["sessions"] = sorted(store.load_sessions(), key=lambda r: r.session_id)
        return out
    finally:
        store.close()


async def test_the_memory_store_answers_as_the_sqlite_store(tmp_path: Path) -> None:
    real = await _script(SQLiteStore(str(tmp_path / "records.db"), indexer="thread"))
    double = await _script(MemoryStore())
    assert double == real
    assert len(real["s1"]) == 5 and real["retry_a"]["metadata"]["call_index"] == 4 and real["retry_b"] is None
    # a restart counts what the live ledger counted: the aborted call (partial ids) is a call and
    # an invalid one, but neither an agent call nor tokens; the failed one is a call only
    s1 = real["sessions"][0]
    assert s1.state["totals"] == {"calls": 5, "agent_calls": 2, "prompt_tokens": 10 + 11 + 14,
                                  "completion_tokens": 6, "failed_calls": 1, "invalid_calls": 2, "tool_calls": 4}
    assert s1.next_call_index == 5


async def test_a_stored_record_does_not_follow_later_changes_to_the_callers_objects() -> None:
    store = MemoryStore()
    pending = _record("s", 0, "ok", digest="a")
    await store.append(pending)
    pending.metadata["status"] = "changed"
    pending.request["messages"].append({"role": "user", "content": "later"})
    [stored] = await store.read_records("s")
    assert stored["metadata"]["status"] == "ok" and len(stored["request"]["messages"]) == 1


async def test_a_failing_store_refuses_every_append() -> None:
    store = MemoryStore()
    store.fail_appends = OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        await store.append(_record("s", 0, "ok", digest="a"))
    assert await store.read_records("s") == []
