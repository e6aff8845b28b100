"""An in-memory record store: a test double for ``SQLiteStore`` in step tests.

A step test builds one flow and runs one step (``openenv_harness/testing/tflow.py``); what it needs
of storage is the interface (``RecordStore``): append and read back, find a retry's record, seal a
closed session, recover sessions. This store answers the same calls from dicts, so a step test needs
no disk and no indexer thread. It returns records in the same ``TraceEntry`` shape as the SQLite
store -- ids, logprobs as float64, ``loss_mask``, ``metadata.seq`` -- and recovers sessions with
the same counts; ``tests/testing/test_memory_store.py`` holds it to ``SQLiteStore`` call by call.

It is not durable, and a test that is about durability uses the real store.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import orjson

from openenv_harness.recorder.store.base import PendingRecord, RecordStore, SessionRow, SessionSealed


class MemoryStore(RecordStore):
    """Sessions and records in dicts; ``fail_appends`` makes every append raise (a store that cannot write)."""

    def __init__(self) -> None:
        self._sessions: dict[str, SessionRow] = {}
        self._records: list[tuple[PendingRecord, int]] = []
        self._sealed: set[str] = set()
        #: one sequence for everything journalled, session rows included, as the SQLite journal numbers them
        self._journalled = 0
        self.fail_appends: Exception | None = None
        self.opened = False

    def open(self) -> None:
        self.opened = True

    def close(self) -> None:
        self.opened = False

    async def append(self, record: PendingRecord) -> int:
        if record.session_id in self._sealed:
            raise SessionSealed(record.session_id)
        if self.fail_appends is not None:
            raise self.fail_appends
        # what a durable store holds is a copy: later changes to the caller's objects do not reach it
        kept = copy.copy(record)
        kept.request = orjson.loads(record.request_json or orjson.dumps(record.request))
        kept.response = orjson.loads(orjson.dumps(record.response))
        kept.metadata = orjson.loads(orjson.dumps(record.metadata))
        self._journalled += 1
        seq = self._journalled
        self._records.append((kept, seq))
        return seq

    async def put_session(self, row: SessionRow) -> None:
        self._sessions[row.session_id] = copy.deepcopy(row)
        self._journalled += 1

    def seal(self, session_id: str) -> None:
        self._sealed.add(session_id)

    def load_sessions(self) -> list[SessionRow]:
        out = []
        for row in self._sessions.values():
            mine = [r for r, _ in self._records if r.session_id == row.session_id]
            loaded = copy.deepcopy(row)
            loaded.next_call_index = max((r.call_index for r in mine), default=-1) + 1
            loaded.state = {**loaded.state, "totals": _totals(mine) if mine else {}}
            out.append(loaded)
        return out

    async def read_records(self, session_id: str, *, after_seq: int = 0) -> list[dict[str, Any]]:
        return list(self.iter_records(session_id, after_seq=after_seq))

    def iter_records(self, session_id: str, *, after_seq: int = 0) -> Iterator[dict[str, Any]]:
        for record, seq in list(self._records):
            if record.session_id == session_id and seq > after_seq:
                yield _entry(record, seq)

    async def find_by_digest(self, session_id: str, request_digest: str) -> dict[str, Any] | None:
        found = [(r, seq) for r, seq in self._records if r.session_id == session_id and r.status == "ok"
                 and r.metadata.get("request_digest") == request_digest]
        return _entry(*found[-1]) if found else None

    def stats(self) -> dict[str, Any]:
        return {"records_written": len(self._records), "failure": self.failure()}


def _entry(record: PendingRecord, seq: int) -> dict[str, Any]:
    """A stored record as a reader gets it (``store/reads.py``: ``decode_row``)."""
    prompt = list(record.prompt_ids) if record.prompt_ids is not None else []
    completion = list(record.completion_ids) if record.completion_ids is not None else []
    entry: dict[str, Any] = {
        "request": copy.deepcopy(record.request),
        "response": copy.deepcopy(record.response),
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "per_token_logps": [float(x) for x in record.logprobs] if record.logprobs is not None else [],
        "loss_mask": [0] * len(prompt) + [1 if record.trainable else 0] * len(completion),
        "metadata": {**copy.deepcopy(record.metadata), "seq": seq},
    }
    if record.completion_tokens is not None:
        entry["completion_tokens"] = list(record.completion_tokens)
    return entry


def _totals(records: list[PendingRecord]) -> dict[str, int]:
    """What a restart counts from a session's records (``store/reads.py``: ``load_sessions``)."""
    served = [r for r in records if r.status != "failed" and not r.metadata.get("partial")]
    last_limits = records[-1].metadata.get("limits") or {}
    return {
        "calls": len(records),
        "agent_calls": sum(r.call_kind == "agent" for r in served),
        "prompt_tokens": sum(len(r.prompt_ids) for r in served if r.prompt_ids is not None),
        "completion_tokens": sum(len(r.completion_ids) for r in served if r.completion_ids is not None),
        "failed_calls": sum(r.status == "failed" for r in records),
        "invalid_calls": sum(r.status == "invalid" for r in records),
        "tool_calls": int(last_limits.get("tool_calls") or 0),
    }
