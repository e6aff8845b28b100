"""Delta encoding of a record's lists: what it shares with an earlier record of its session.

Every call repeats the conversation so far, so a record stores its prompt and its message-hash
list as (an earlier record of the session, how many of its items are shared, the new items):
storage follows the *new* content, not the conversation's length. The writing half (``hash_delta``
and the ``SessionTail`` the indexer keeps per session, ``index_ops.py``) and the reading half
(``DeltaLists``, which resolves chains of bases, ``reads.py``) are one format, kept in one module so
they cannot drift apart. Which earlier prompt a new one is cut against is ``prompt_sketch.py``'s.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from openenv_harness.recorder.store import blocks
from openenv_harness.recorder.store.prompt_sketch import PromptSketch

__all__ = ["DeltaLists", "SessionTail", "hash_delta"]


class SessionTail:
    """What a session's latest record stored: the base of the next record's deltas."""

    __slots__ = ("known", "msgs", "msgs_seq", "prompts")

    def __init__(self) -> None:
        #: the session's latest records' prompts, as sketches (``prompt_sketch.py``): candidate bases, newest first
        self.prompts: list[PromptSketch] = []
        self.msgs_seq: int | None = None
        self.msgs: list[bytes] = []
        #: blob hashes the latest record stored: not inserted again by the next one
        self.known: set[bytes] = set()


def hash_delta(base_seq: int | None, base: list[bytes], new: list[bytes]) -> tuple[int | None, int, bytes]:
    """``(base_seq, shared, tail)``: ``new`` as the first ``shared`` hashes of ``base`` plus a tail.

    Every call repeats the history, so a record keeps only what its predecessor did not have: storage
    per record follows the *new* content, not the conversation length.
    """
    shared = 0
    if base_seq is not None:
        limit = min(len(base), len(new))
        while shared < limit and base[shared] == new[shared]:
            shared += 1
    if shared == 0:
        return None, 0, blocks.join_hashes(new)
    return base_seq, shared, blocks.join_hashes(new[shared:])


class DeltaLists:
    """Resolves the delta-encoded hash lists of records, loading bases from the store as needed."""

    def __init__(self, conn: sqlite3.Connection, *, keep: int | None = None) -> None:
        self._conn = conn
        #: resolved values kept (the latest first in line to stay), None: all -- a base dropped
        #: early is only walked back to again
        self._keep = keep
        self._rows: dict[int, tuple[Any, ...]] = {}
        self._prompts: dict[int, bytes | None] = {}
        self._msgs: dict[int, list[bytes] | None] = {}

    def remember(self, seq: int, *row: Any) -> None:
        self._rows[seq] = row
        if self._keep is not None:
            for memo in (self._rows, self._prompts, self._msgs):
                while len(memo) > self._keep:
                    del memo[next(iter(memo))]  # dicts keep insertion order: the oldest goes

    def _row(self, seq: int) -> tuple[Any, ...]:
        row = self._rows.get(seq)
        if row is None:
            got = self._conn.execute(
                "SELECT prompt_base, prompt_shared, prompt_tail, msgs_base, msgs_shared, msgs FROM records"
                " WHERE seq = ?", (seq,)
            ).fetchone()
            if got is None:
                raise RuntimeError(f"store is missing record {seq}, the base of a later record")
            row = tuple(got)
            self._rows[seq] = row
        return row

    def _resolve(self, seq: int, offset: int, memo: dict[int, Any]) -> Any:
        """Record ``seq``'s value: its base's first ``shared`` items plus its own tail (prompt bytes at
        offset 0, ``shared`` in tokens of 4 bytes; message-hash lists at offset 3)."""
        chain: list[int] = []
        cur: int | None = seq
        while cur is not None and cur not in memo:  # walk back iteratively: chains can be long
            chain.append(cur)
            base, _shared, tail = self._row(cur)[offset : offset + 3]
            cur = base if tail is not None else None
        for s in reversed(chain):
            base, shared, tail = self._row(s)[offset : offset + 3]
            if tail is None:
                memo[s] = None  # this record has no such list (e.g. a failed call has no prompt)
                continue
            if offset == 0:
                memo[s] = bytes(tail) if base is None else (memo.get(base) or b"")[: shared * 4] + tail
            else:
                own = blocks.split_hashes(tail)
                memo[s] = own if base is None else (memo.get(base) or [])[:shared] + own
        return memo[seq]

    def prompt(self, seq: int) -> bytes | None:
        prompt: bytes | None = self._resolve(seq, 0, self._prompts)
        return prompt

    def messages(self, seq: int) -> list[bytes] | None:
        messages: list[bytes] | None = self._resolve(seq, 3, self._msgs)
        return messages
