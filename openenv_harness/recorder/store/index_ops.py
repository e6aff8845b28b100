"""The indexer's operations: what turns a journalled record or session row into SQLite rows.

Why an object of its own: these run off the reply path -- on the indexer thread, or in the index
process (``index_child.py``) -- and need only the connection they are given and a per-session cache
of delta bases, which this object holds. Nothing here knows the store, the journal or the queue:
the bookkeeping around each transaction (which seqs are indexed, the journal's clean-up, waking
callers) is the journal queue's (``journal_queue.py``), done with what ``run_batch`` returns. The
store holds one ``IndexOps`` for its own start-up and a thread indexer; an index process builds its
own. Operations travel by name (to a child process too); ``_OPS`` maps each to its method.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from array import array
from collections import OrderedDict
from typing import Any

import orjson

from openenv_harness.recorder.store import blocks
from openenv_harness.recorder.store.base import PendingRecord, SessionRow
from openenv_harness.recorder.store.deltas import SessionTail, hash_delta
from openenv_harness.recorder.store.prompt_sketch import PromptSketch, block_digests
from openenv_harness.recorder.store.prompt_sketch import prompt_delta as _prompt_delta
from openenv_harness.recorder.store.schema import REF_MESSAGES, REF_TOOLS

#: logged under the store's name, whichever of its modules logs: one logger to configure for the store
log = logging.getLogger("openenv_harness.recorder.store.sqlite")

#: How many earlier prompts of a session are tried as the base of a new one.
_PROMPT_BASES = 2
#: How many sessions' "recently stored hashes" the writer remembers (a cache, not state).
_HASH_CACHE_SESSIONS = 512
#: What the indexer runs, by the name an operation travels under (to a child process too).
_OPS = {"append": "_op_append", "session": "_op_put_session", "forget": "_op_forget", "nothing": "_op_nothing"}


#: What ``run_batch`` returns per operation: its value, or the error that lost it.
Result = tuple[Any, BaseException | None]


class IndexOps:
    """The operations an indexer runs, one transaction per batch, and the delta bases they share."""

    def __init__(self) -> None:
        #: session id -> what its latest record stored (delta base for the next one; a cache, not state)
        self._recent: OrderedDict[str, SessionTail] = OrderedDict()

    def run_batch(self, conn: sqlite3.Connection, batch: list[tuple[str, Any]]) -> list[Result]:
        """All of ``batch`` (``(operation name, argument)``) in one transaction; if anything fails,
        each op again in its own.

        The common case pays one BEGIN and one COMMIT for the whole batch. A failure is rare (a
        disk error, a bug), and then only the op that fails is lost: the batch is rolled back and
        redone op by op, with the indexer's caches dropped first -- they may describe rows that the
        rollback removed, and they are only an optimisation.
        """
        try:
            conn.execute("BEGIN IMMEDIATE")
            results: list[Result] = [(getattr(self, _OPS[name])(conn, arg), None) for name, arg in batch]
            conn.execute("COMMIT")
        except Exception as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            self._recent.clear()
            if len(batch) > 1:
                return [result for item in batch for result in self.run_batch(conn, [item])]
            log.exception("store operation failed")
            return [(None, exc)]
        return results

    def _op_nothing(self, conn: sqlite3.Connection, arg: None) -> None:
        """A barrier: the indexer reaches it only after everything submitted before it is committed."""

    def _op_forget(self, conn: sqlite3.Connection, session_id: str) -> None:
        self._recent.pop(session_id, None)

    def _recent_for(self, session_id: str) -> SessionTail:
        tail = self._recent.get(session_id)
        if tail is None:
            tail = SessionTail()
            self._recent[session_id] = tail
            if len(self._recent) > _HASH_CACHE_SESSIONS:
                self._recent.popitem(last=False)
        else:
            self._recent.move_to_end(session_id)
        return tail

    def _op_append(self, conn: sqlite3.Connection, item: tuple[Any, ...]) -> int:
        seq: int = item[0]  # (seq, record[, where in the journal])
        rec: PendingRecord = item[1]
        tail = self._recent_for(rec.session_id)
        known = tail.known
        written: set[bytes] = set()

        prompt_len = 0
        prompt_delta: tuple[int | None, int, bytes | None] = (None, 0, None)
        prompt_bytes: bytes | None = None
        if rec.prompt_ids is not None:
            prompt_len = len(rec.prompt_ids)
            prompt_bytes = blocks.ids_to_bytes(rec.prompt_ids)
            digests = block_digests(prompt_bytes)
            prompt_delta = _prompt_delta(tail.prompts, prompt_bytes, digests)

        request = dict(rec.request)
        msgs_delta: tuple[int | None, int, bytes | None] = (None, 0, None)
        new_msgs: list[bytes] | None = None
        messages = request.get("messages")
        if isinstance(messages, list):
            pairs = blocks.message_blobs(messages)
            put_blobs(conn, pairs, known)
            new_msgs = [h for h, _ in pairs]
            written.update(new_msgs)
            msgs_delta = hash_delta(tail.msgs_seq, tail.msgs, new_msgs)
            request["messages"] = {REF_MESSAGES: True}
        tools = request.get("tools")
        if isinstance(tools, list) and tools:
            data = orjson.dumps(tools)
            h = blocks.digest(data)
            put_blobs(conn, [(h, data)], known)
            written.add(h)
            request["tools"] = {REF_TOOLS: h.hex()}

        md = rec.metadata
        conn.execute(
            "INSERT INTO records(seq, session_id, call_index, call_kind, status, trainable, request_digest,"
            " created_at, prompt_len, prompt_base, prompt_shared, prompt_tail, msgs_base, msgs_shared, msgs,"
            " completion_ids, logprobs, completion_tokens, request, response, metadata)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                seq,
                rec.session_id,
                rec.call_index,
                rec.call_kind,
                rec.status,
                1 if rec.trainable else 0,
                md.get("request_digest", ""),
                rec.created_at,
                prompt_len,
                *prompt_delta,
                *msgs_delta,
                blocks.ids_to_bytes(rec.completion_ids) if rec.completion_ids is not None else None,
                _floats_to_bytes(rec.logprobs) if rec.logprobs is not None else None,
                orjson.dumps(rec.completion_tokens) if rec.completion_tokens is not None else None,
                blocks.pack_blob(orjson.dumps(request)),
                blocks.pack_blob(orjson.dumps(rec.response)),
                blocks.pack_blob(orjson.dumps(md)),
            ),
        )
        if prompt_bytes is not None:
            tail.prompts.insert(0, PromptSketch(seq, prompt_bytes, digests))
            del tail.prompts[_PROMPT_BASES:]
        if new_msgs is not None:
            tail.msgs_seq, tail.msgs = seq, new_msgs
        tail.known = written
        return seq

    def _op_put_session(self, conn: sqlite3.Connection, item: tuple[int, SessionRow]) -> None:
        row = item[1]  # (seq in the journal, row)
        conn.execute(
            "INSERT INTO sessions(id, secret_digest, status, created_at, closed_at, stop_reason, spec, state)"
            " VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(id) DO UPDATE SET status=excluded.status,"
            " closed_at=excluded.closed_at, stop_reason=excluded.stop_reason, state=excluded.state",
            (
                row.session_id,
                row.secret_digest,
                row.status,
                row.created_at,
                row.closed_at,
                row.stop_reason,
                orjson.dumps(row.spec),
                orjson.dumps(row.state),
            ),
        )


def put_blobs(conn: sqlite3.Connection, pairs: list[tuple[bytes, bytes]], known: set[bytes],
              *, compress: bool = True) -> None:
    """Store the blobs that ``known`` (what the session's previous record stored) lacks; a hash
    stored by any earlier record is skipped by SQLite, since a hash names one content."""
    fresh = [(h, blocks.pack_blob(data) if compress else blocks.raw_blob(data)) for h, data in pairs
             if h not in known]
    if fresh:
        conn.executemany("INSERT OR IGNORE INTO blobs(hash, data) VALUES (?, ?)", fresh)


def _floats_to_bytes(values: array[float]) -> bytes:
    return blocks.ids_to_bytes(values)  # same little-endian rule, typecode 'd'
