"""The delta format on its own: a list is stored as its base's shared prefix plus its own tail, and
reading resolves a chain of bases back to every item, also when the bases kept in memory are few."""

from __future__ import annotations

import sqlite3
from array import array

from openenv_harness.recorder.store import blocks
from openenv_harness.recorder.store.deltas import DeltaLists, hash_delta
from openenv_harness.recorder.store.schema import SCHEMA


def _h(i: int) -> bytes:
    return blocks.digest(str(i).encode())


def test_a_list_keeps_only_what_its_base_lacks() -> None:
    base = [_h(i) for i in range(5)]
    assert hash_delta(7, base, base[:3] + [_h(9)]) == (7, 3, blocks.join_hashes([_h(9)]))
    assert hash_delta(7, base, base + [_h(9)]) == (7, 5, blocks.join_hashes([_h(9)])), "the whole base"
    assert hash_delta(7, base, [_h(9)] + base) == (None, 0, blocks.join_hashes([_h(9)] + base)), "no prefix"
    assert hash_delta(None, [], base) == (None, 0, blocks.join_hashes(base)), "no base"


def _store_chain(conn: sqlite3.Connection, prompts: list[list[int]], msgs: list[list[bytes]]) -> None:
    """Records 1..n, each a delta of the one before it, written as the indexer writes them."""
    conn.executescript(SCHEMA)
    for seq, (ids, hashes) in enumerate(zip(prompts, msgs), start=1):
        shared = 0
        if seq > 1:
            before = prompts[seq - 2]
            while shared < min(len(before), len(ids)) and before[shared] == ids[shared]:
                shared += 1
        prompt_tail = blocks.ids_to_bytes(array("I", ids[shared:]))
        mbase, mshared, mtail = hash_delta(seq - 1 if seq > 1 else None, msgs[seq - 2] if seq > 1 else [], hashes)
        conn.execute(
            "INSERT INTO records(seq, session_id, call_index, call_kind, status, trainable, request_digest,"
            " created_at, prompt_len, prompt_base, prompt_shared, prompt_tail, msgs_base, msgs_shared, msgs,"
            " request, response, metadata) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (seq, "s", seq - 1, "agent", "ok", 1, "", 0.0, len(ids), seq - 1 if shared else None, shared,
             prompt_tail, mbase, mshared, mtail, b"", b"", b""),
        )


def test_a_chain_of_bases_resolves_to_every_item() -> None:
    prompts = [list(range(n)) + [100 + n] for n in (3, 6, 9, 12)]  # each shares a prefix with the last
    msgs = [[_h(i) for i in range(n)] for n in (1, 2, 3, 4)]
    conn = sqlite3.connect(":memory:")
    _store_chain(conn, prompts, msgs)
    cold = DeltaLists(conn)
    for seq in (4, 2, 3, 1):  # nothing remembered: the newest's whole chain is read back from the database
        assert blocks.bytes_to_ids(cold.prompt(seq)).tolist() == prompts[seq - 1], seq
        assert cold.messages(seq) == msgs[seq - 1], seq
    for keep in (None, 1):  # as a streamed read goes: each row remembered, at most ``keep`` of them kept
        lists = DeltaLists(conn, keep=keep)
        for row in conn.execute("SELECT seq, prompt_base, prompt_shared, prompt_tail, msgs_base, msgs_shared, msgs"
                                " FROM records ORDER BY seq").fetchall():
            lists.remember(*row)
            seq = row[0]
            assert blocks.bytes_to_ids(lists.prompt(seq)).tolist() == prompts[seq - 1], (keep, seq)
            assert lists.messages(seq) == msgs[seq - 1], (keep, seq)
