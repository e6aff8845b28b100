"""A recovered session's chain state rebuilt from its records: once, bounded, and never fatal."""

from __future__ import annotations

import asyncio
import time
from array import array
from typing import Any, Iterator

from openenv_harness.recorder.dialects.memory import reasoning_handle
from openenv_harness.recorder.session.restore import rebuild, restore
from openenv_harness.recorder.session.call_numbers import CallNumbers
from openenv_harness.recorder.session.live import LiveSession
from openenv_harness.recorder.session.spec import SessionSpec
from openenv_harness.recorder.store.base import RecordStore


class _ListStore(RecordStore):
    """A test double for a store: serves a fixed list of records and counts the reads."""

    def __init__(self, records: list[dict[str, Any]], fail: bool = False) -> None:
        self.records, self.fail, self.reads = records, fail, 0

    def open(self) -> None: ...

    def close(self) -> None: ...

    async def append(self, record: Any) -> int:
        raise AssertionError("a rebuild writes nothing")

    async def put_session(self, row: Any) -> None:
        raise AssertionError("a rebuild writes nothing")

    def load_sessions(self) -> list[Any]:
        return []

    async def read_records(self, session_id: str, *, after_seq: int = 0) -> list[dict[str, Any]]:
        return list(self.iter_records(session_id))

    def iter_records(self, session_id: str, *, after_seq: int = 0) -> Iterator[dict[str, Any]]:
        self.reads += 1
        if self.fail:
            raise OSError("disk gone")
        yield from self.records

    async def find_by_digest(self, session_id: str, request_digest: str) -> dict[str, Any] | None:
        return None

    def stats(self) -> dict[str, Any]:
        return {}


def _record(i: int, *, dialect: str = "anthropic", status: str = "ok") -> dict[str, Any]:
    call = {"id": f"toolu_{i}", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}
    message = {"role": "assistant", "content": "", "reasoning": f"think {i}", "tool_calls": [call]}
    return {"response": {"id": f"chatcmpl-{i}", "choices": [{"index": 0, "message": message,
                                                             "finish_reason": "tool_calls"}]},
            "prompt_token_ids": list(range(10 * i + 3)), "completion_token_ids": [7, 8, 9],
            "metadata": {"node_id": f"s/{i}", "dialect": dialect, "status": status, "error": None,
                         "fidelity": {"class": "root" if i == 0 else "exact"},
                         "sampled_arguments": ['{"command":"ls"}']}}


def _session() -> LiveSession:
    return LiveSession(id="s", secret_digest="d", spec=SessionSpec(), created_at=time.time(), numbers=CallNumbers(2),
                       restore_pending=True)


def test_the_rebuild_remembers_what_each_reply_handed_out_and_the_chain_tip() -> None:
    records = [_record(0), _record(1), _record(2, dialect="chat"), _record(3, status="failed")]
    tracker, memory, _ = rebuild(records)
    assert memory is not None and tracker is not None
    for i in (0, 1):
        assert memory.sampled_arguments(f"toolu_{i}", {"command": "ls"}) == '{"command":"ls"}'
        assert memory.reasoning(reasoning_handle(f"chatcmpl-{i}", f"think {i}")) == f"think {i}"
    assert memory.sampled("toolu_2") is None and memory.sampled("toolu_3") is None  # not handed out by a dialect
    assert memory.sampled_arguments("toolu_0", {"command": "ls -la"}) is None  # changed by the agent: its own
    following = array("I", [*records[3]["prompt_token_ids"], 7, 8, 9, 1])
    assert tracker.observe("s/4", following, array("I", [1])).parent == "s/3"


def test_the_rebuild_stays_within_the_memorys_bounds() -> None:
    tracker, memory, _ = rebuild(_record(i) for i in range(1500))
    assert memory is not None and len(memory) <= memory.max_entries
    assert memory.sampled("toolu_1499") == '{"command":"ls"}' and memory.sampled("toolu_0") is None  # oldest out
    assert tracker is not None and len(tracker.tips) == 1


def test_concurrent_calls_share_one_rebuild() -> None:
    store, session = _ListStore([_record(0), _record(1)]), _session()

    async def main() -> None:
        await asyncio.gather(*(restore(store, session) for _ in range(5)))
        await restore(store, session)

    asyncio.run(main())
    assert store.reads == 1 and not session.restore_pending
    assert session.dialect_memory.sampled("toolu_1") == '{"command":"ls"}'
    assert session.chain.tip_ids == ["s/1"]


def test_an_unreadable_store_leaves_the_state_empty_and_the_session_serving() -> None:
    store, session = _ListStore([], fail=True), _session()
    asyncio.run(restore(store, session))
    assert store.reads == 1 and not session.restore_pending
    assert len(session.dialect_memory) == 0 and session.chain.tip_ids == []


def test_a_rebuild_comes_under_the_memory_a_count_tokens_call_used_meanwhile() -> None:
    """A count-tokens route may use the dialect memory before the first call waits for the rebuild:
    the rebuilt entries are older, the session's own newer, and neither is lost."""
    store, session = _ListStore([_record(0), _record(1)]), _session()
    session.dialect_memory.remember_call("toolu_live", '{"x":1}', {"x": 1})
    asyncio.run(restore(store, session))
    assert session.dialect_memory.sampled("toolu_live") == '{"x":1}'
    assert session.dialect_memory.sampled("toolu_0") == '{"command":"ls"}'
    assert list(session.dialect_memory._entries)[-1] == ("call", "toolu_live")


def test_a_restart_gives_back_the_retry_window_of_answered_calls() -> None:
    """A retry of a call answered before the restart is answered from its record (``call/admit.py: dedupe``),
    within the window; a failed call's digest is not one."""
    records = [_record(i) for i in range(4)] + [_record(4, status="failed")]
    for i, record in enumerate(records):
        record["metadata"].update(request_digest=f"d{i}", call_index=i)
    records[4]["metadata"]["error"] = {"kind": "upstream"}
    store, session = _ListStore(records), _session()
    asyncio.run(restore(store, session, window=2))
    assert [d for d in ("d0", "d1", "d2", "d3", "d4") if session.replay.first_attempt(d) is not None] == ["d2", "d3"]
    assert rebuild(records).answered == []  # no window: nothing kept
