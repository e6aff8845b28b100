"""The SQLite store: exact reconstruction, linear growth, durability semantics, restart recovery."""

from __future__ import annotations

import asyncio
import random
from array import array
from pathlib import Path

import pytest

from openenv_harness.recorder.store import PendingRecord, SessionRow, SQLiteStore


def _rec(session: str, index: int, prompt: list[int], completion: list[int], messages: list[dict]) -> PendingRecord:
    return PendingRecord(
        session_id=session, call_index=index, call_kind="agent", status="ok",
        request={"model": "m", "messages": messages, "tools": [{"type": "function", "function": {"name": "bash"}}],
                 "stream": True},
        response={"id": f"c{index}", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                                  "finish_reason": "stop"}]},
        prompt_ids=array("I", prompt), completion_ids=array("I", completion),
        logprobs=array("d", [-0.1 - i / 1000 for i in range(len(completion))]),
        completion_tokens=None, trainable=True,
        metadata={"node_id": f"{session}/{index}", "session_id": session, "call_index": index,
                  "request_digest": f"d{index}", "status": "ok"},
        created_at=0.0,
    )


def _conversation(turns: int, system_tokens: int, rng: random.Random):
    prompt = [rng.randrange(50000) for _ in range(system_tokens)]
    messages = [{"role": "system", "content": "S" * (system_tokens * 4)}, {"role": "user", "content": "task"}]
    for t in range(turns):
        completion = [rng.randrange(50000) for _ in range(40)]
        yield t, list(prompt), completion, [dict(m) for m in messages]
        tool = [rng.randrange(50000) for _ in range(120)]
        prompt = prompt + completion + tool
        messages = messages + [{"role": "assistant", "content": f"step {t}"}, {"role": "tool", "content": "R" * 480}]


@pytest.fixture
def store(tmp_path: Path):
    s = SQLiteStore(tmp_path / "r.db")
    s.open()
    yield s
    s.close()


async def test_records_round_trip_exactly(store: SQLiteStore) -> None:
    rng = random.Random(1)
    originals = []
    for t, prompt, completion, messages in _conversation(12, 700, rng):
        rec = _rec("s1", t, prompt, completion, messages)
        originals.append(rec)
        seq = await store.append(rec)
        assert seq > 0
    got = await store.read_records("s1")
    assert len(got) == 12
    for rec, entry in zip(originals, got):
        assert entry["prompt_token_ids"] == rec.prompt_ids.tolist()
        assert entry["completion_token_ids"] == rec.completion_ids.tolist()
        assert entry["per_token_logps"] == rec.logprobs.tolist()  # doubles, bit-exact
        assert entry["request"] == rec.request
        assert list(entry["request"]) == list(rec.request)  # key order kept
        assert entry["loss_mask"] == [0] * len(rec.prompt_ids) + [1] * len(rec.completion_ids)
        assert entry["metadata"]["node_id"] == rec.metadata["node_id"]
    seqs = [e["metadata"]["seq"] for e in got]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


async def test_storage_grows_linearly_with_conversation_length(store: SQLiteStore) -> None:
    rng = random.Random(2)
    final_ids = 0
    for t, prompt, completion, messages in _conversation(100, 2000, rng):
        await store.append(_rec("long", t, prompt, completion, messages))
        final_ids = len(prompt) + len(completion)
    used = store.session_bytes("long")["total"]
    whole_prompts = sum(len(p) for _, p, _, _ in _conversation(100, 2000, random.Random(2))) * 4
    # quadratic storage would be ~ whole_prompts; block sharing keeps it near the final size
    assert used < 3 * final_ids * 4 + 200_000, (used, final_ids)
    assert used < whole_prompts / 10


async def test_concurrent_appends_from_many_sessions_never_cross(store: SQLiteStore) -> None:
    async def session(name: str) -> None:
        rng = random.Random(name)
        for t, prompt, completion, messages in _conversation(6, 300, rng):
            await store.append(_rec(name, t, prompt, completion, messages))

    names = [f"s{i}" for i in range(16)]
    await asyncio.gather(*(session(n) for n in names))
    for name in names:
        got = await store.read_records(name)
        assert [e["metadata"]["call_index"] for e in got] == list(range(6))
        assert all(e["metadata"]["session_id"] == name for e in got)
        expected = [p for _, p, _, _ in _conversation(6, 300, random.Random(name))]
        assert [e["prompt_token_ids"] for e in got] == expected


async def test_sessions_persist_and_call_index_recovers(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    s = SQLiteStore(path)
    s.open()
    await s.put_session(SessionRow("a", "digest-a", "open", 1.0, {"metadata": {"k": 1}}))
    for t, prompt, completion, messages in _conversation(3, 50, random.Random(3)):
        await s.append(_rec("a", t, prompt, completion, messages))
    s.close()
    s2 = SQLiteStore(path)
    s2.open()
    rows = s2.load_sessions()
    assert [(r.session_id, r.secret_digest, r.next_call_index, r.spec) for r in rows] == [
        ("a", "digest-a", 3, {"metadata": {"k": 1}})
    ]
    assert len(await s2.read_records("a")) == 3
    s2.close()


async def test_find_by_digest_returns_the_latest_ok_record(store: SQLiteStore) -> None:
    rec = _rec("x", 0, [1, 2, 3], [4], [{"role": "user", "content": "q"}])
    await store.append(rec)
    found = await store.find_by_digest("x", "d0")
    assert found is not None and found["completion_token_ids"] == [4]
    assert await store.find_by_digest("x", "nope") is None


async def test_closed_store_refuses_writes(tmp_path: Path) -> None:
    s = SQLiteStore(tmp_path / "r.db")
    s.open()
    s.close()
    with pytest.raises(RuntimeError, match="closed"):
        await s.append(_rec("x", 0, [1], [2], [{"role": "user", "content": "q"}]))


async def test_interleaved_chains_failed_calls_and_partial_reads_reconstruct_exactly(store: SQLiteStore) -> None:
    """Bases are chosen among earlier prompts (a sub-agent finds its own), failed calls carry no
    prompt, and reading from the middle of a session loads bases it did not read."""
    rng = random.Random(5)
    main = [rng.randrange(50000) for _ in range(900)]
    sub = main[:100] + [rng.randrange(50000) for _ in range(700)]
    originals = []
    for i in range(12):
        if i % 3 == 2:
            rec = _rec("mix", i, [1], [1], [{"role": "user", "content": f"failed {i}"}])
            rec.prompt_ids = rec.completion_ids = rec.logprobs = None
            rec.status = "failed"
        elif i % 3 == 0:
            main = main + [rng.randrange(50000) for _ in range(150)]
            rec = _rec("mix", i, main, [7] * 5, [{"role": "user", "content": "main"}, {"role": "tool", "content": str(i)}])
        else:
            sub = sub + [rng.randrange(50000) for _ in range(90)]
            rec = _rec("mix", i, sub, [8] * 3, [{"role": "user", "content": "sub"}, {"role": "tool", "content": str(i)}])
        originals.append(rec)
        await store.append(rec)
    got = await store.read_records("mix")
    for rec, entry in zip(originals, got):
        expected = rec.prompt_ids.tolist() if rec.prompt_ids is not None else []
        assert entry["prompt_token_ids"] == expected
        assert entry["request"]["messages"] == rec.request["messages"]
    middle = got[6]["metadata"]["seq"] - 1
    tail = await store.read_records("mix", after_seq=middle)
    assert [e["prompt_token_ids"] for e in tail] == [e["prompt_token_ids"] for e in got[6:]]
    # the sub-agent's prompts were stored against the sub-agent's earlier prompt, not the main chain's
    used = store.session_bytes("mix")["total"]
    assert used < (len(main) + len(sub)) * 4 * 3
