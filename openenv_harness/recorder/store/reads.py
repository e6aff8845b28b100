"""The read side: SQLite rows back into the records and session rows the recorder stored.

Why a module of its own: reading resolves what writing encoded -- prompts and message lists as
deltas of earlier records (``deltas.py``), messages and tools as content-addressed blobs
(``blocks.py``) -- and that is the same work whoever reads: a whole session at once, a stream of
pages (``SQLiteStore.iter_records``), or a restart's session totals. Plain functions of the
connection they are given: which connection, and the gate a reader passes (``read_gate.py``),
are the store's business.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson

from openenv_harness.recorder.store import blocks
from openenv_harness.recorder.store.base import SessionRow
from openenv_harness.recorder.store.deltas import DeltaLists
from openenv_harness.recorder.store.schema import REF_MESSAGES, REF_TOOLS


def load_sessions(conn: sqlite3.Connection) -> list[SessionRow]:
    """Every session row, with what a restart needs recomputed from its records (``SessionRow``)."""
    next_index = dict(
        conn.execute("SELECT session_id, MAX(call_index) + 1 FROM records GROUP BY session_id").fetchall()
    )
    # budgets keep counting across a restart: totals are recomputed from the records themselves
    totals = {
        row[0]: {"calls": row[1], "agent_calls": row[2], "prompt_tokens": row[3], "completion_tokens": row[4],
                 "failed_calls": row[5], "invalid_calls": row[6]}
        for row in conn.execute(
            "SELECT session_id, COUNT(*),"
            " SUM(call_kind = 'agent' AND status != 'failed'),"
            " SUM(CASE WHEN status != 'failed' THEN prompt_len ELSE 0 END),"
            " SUM(COALESCE(LENGTH(completion_ids), 0) / 4),"
            " SUM(status = 'failed'), SUM(status = 'invalid')"
            " FROM records GROUP BY session_id"
        )
    }
    # an aborted sample (``partial``, status invalid) keeps its ids but was never handed to the agent:
    # the live ledger counts it as a call and nothing more (``call/pending.py``), and so does a restart
    for session_id, kind, prompt_len, completion_len, md in conn.execute(
        "SELECT session_id, call_kind, prompt_len, COALESCE(LENGTH(completion_ids), 0) / 4, metadata"
        " FROM records WHERE status = 'invalid'"
    ):
        if orjson.loads(blocks.unpack_blob(md)).get("partial"):
            t = totals[session_id]
            t["agent_calls"] -= kind == "agent"
            t["prompt_tokens"] -= prompt_len or 0
            t["completion_tokens"] -= completion_len
    # tool calls handed over are not a column: the latest record's limits carry the count
    for session_id, md in conn.execute(
        "SELECT session_id, metadata FROM records WHERE seq IN (SELECT MAX(seq) FROM records GROUP BY session_id)"
    ):
        limits = orjson.loads(blocks.unpack_blob(md)).get("limits") or {}
        totals.setdefault(session_id, {})["tool_calls"] = int(limits.get("tool_calls") or 0)
    rows = conn.execute(
        "SELECT id, secret_digest, status, created_at, closed_at, stop_reason, spec, state FROM sessions"
    ).fetchall()
    return [
        SessionRow(
            session_id=r[0],
            secret_digest=r[1],
            status=r[2],
            created_at=r[3],
            closed_at=r[4],
            stop_reason=r[5],
            spec=orjson.loads(r[6]),
            state={**orjson.loads(r[7]), "totals": totals.get(r[0], {})},
            next_call_index=int(next_index.get(r[0], 0) or 0),
        )
        for r in rows
    ]


#: What ``decode_row`` reads of a record, in its order.
COLUMNS = (
    "seq, prompt_base, prompt_shared, prompt_tail, msgs_base, msgs_shared, msgs, completion_ids, logprobs,"
    " completion_tokens, request, response, metadata, trainable, prompt_len"
)


def read_records(conn: sqlite3.Connection, session_id: str, after_seq: int,
                 digest: str | None) -> list[dict[str, Any]]:
    """A session's records after ``after_seq`` (only its ok calls with ``digest``, when given), decoded."""
    sql = f"SELECT {COLUMNS} FROM records WHERE session_id = ? AND seq > ?"
    params: list[Any] = [session_id, after_seq]
    if digest is not None:
        sql += " AND request_digest = ? AND status = 'ok'"
        params.append(digest)
    rows = conn.execute(sql + " ORDER BY seq", params).fetchall()
    lists = DeltaLists(conn)
    blob_cache: dict[bytes, bytes] = {}
    return [decode_row(conn, row, blob_cache, lists) for row in rows]


def fetch_blobs(conn: sqlite3.Connection, hashes: list[bytes], cache: dict[bytes, bytes]) -> None:
    """Load into ``cache`` the blobs of ``hashes`` it lacks; a hash the store does not hold is an error."""
    missing = list({h for h in hashes if h not in cache})
    for i in range(0, len(missing), 500):
        chunk = missing[i : i + 500]
        marks = ",".join("?" * len(chunk))
        for h, data in conn.execute(f"SELECT hash, data FROM blobs WHERE hash IN ({marks})", chunk):
            cache[bytes(h)] = blocks.unpack_blob(data)
    lost = [h.hex() for h in hashes if h not in cache]
    if lost:
        raise RuntimeError(f"store is missing {len(lost)} blob(s), e.g. {lost[0]}")


def decode_row(conn: sqlite3.Connection, row: tuple[Any, ...], cache: dict[bytes, bytes],
               lists: DeltaLists) -> dict[str, Any]:
    """One row of ``COLUMNS`` as the record a reader gets; ``lists`` resolves its deltas (and keeps
    it as a base for the rows after it), ``cache`` holds the blobs already loaded."""
    (seq, pbase, pshared, pblocks, mbase, mshared, mtail, cids, lps, ctoks, req, resp, md, trainable,
     prompt_len) = row
    lists.remember(seq, pbase, pshared, pblocks, mbase, mshared, mtail)
    metadata = orjson.loads(blocks.unpack_blob(md))
    metadata["seq"] = seq
    prompt: list[int] = []
    prompt_bytes = lists.prompt(seq)
    if prompt_bytes is not None:
        prompt = blocks.bytes_to_ids(prompt_bytes).tolist()
        if len(prompt) != prompt_len:
            raise RuntimeError(f"record {seq}: prompt length {len(prompt)} != stored {prompt_len}")
    request = orjson.loads(blocks.unpack_blob(req))
    ref = request.get("messages")
    if isinstance(ref, dict) and REF_MESSAGES in ref:
        hashes = lists.messages(seq) or []
        fetch_blobs(conn, hashes, cache)
        request["messages"] = [orjson.loads(cache[h]) for h in hashes]
    ref = request.get("tools")
    if isinstance(ref, dict) and REF_TOOLS in ref:
        h = bytes.fromhex(ref[REF_TOOLS])
        fetch_blobs(conn, [h], cache)
        request["tools"] = orjson.loads(cache[h])
    completion = blocks.bytes_to_ids(cids).tolist() if cids is not None else []
    logps = _bytes_to_floats(lps) if lps is not None else []
    entry: dict[str, Any] = {
        "request": request,
        "response": orjson.loads(blocks.unpack_blob(resp)),
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "per_token_logps": logps,
        "loss_mask": [0] * len(prompt) + [1 if trainable else 0] * len(completion),
        "metadata": metadata,
    }
    if ctoks is not None:
        entry["completion_tokens"] = orjson.loads(ctoks)
    return entry


def session_bytes(conn: sqlite3.Connection, session_id: str) -> dict[str, int]:
    """Bytes a session occupies (its rows plus every blob it references), for benchmarks."""
    row_bytes = conn.execute(
        "SELECT COALESCE(SUM(LENGTH(COALESCE(prompt_tail, x'')) + LENGTH(COALESCE(msgs, x''))"
        " + LENGTH(COALESCE(completion_ids, x'')) + LENGTH(COALESCE(logprobs, x''))"
        " + LENGTH(request) + LENGTH(response) + LENGTH(metadata) + 48), 0) FROM records WHERE session_id = ?",
        (session_id,),
    ).fetchone()[0]
    lists = DeltaLists(conn)
    hashes: set[bytes] = set()
    for seq, pbase, pshared, pblocks, mbase, mshared, mtail, req in conn.execute(
        "SELECT seq, prompt_base, prompt_shared, prompt_tail, msgs_base, msgs_shared, msgs, request"
        " FROM records WHERE session_id = ? ORDER BY seq", (session_id,)
    ):
        lists.remember(seq, pbase, pshared, pblocks, mbase, mshared, mtail)
        hashes.update(lists.messages(seq) or [])
        ref = orjson.loads(blocks.unpack_blob(req)).get("tools")
        if isinstance(ref, dict):
            hashes.add(bytes.fromhex(ref[REF_TOOLS]))
    blob_bytes = 0
    hl = list(hashes)
    for i in range(0, len(hl), 500):
        chunk = hl[i : i + 500]
        marks = ",".join("?" * len(chunk))
        blob_bytes += conn.execute(
            f"SELECT COALESCE(SUM(LENGTH(data) + LENGTH(hash)), 0) FROM blobs WHERE hash IN ({marks})", chunk
        ).fetchone()[0]
    return {"row_bytes": int(row_bytes), "blob_bytes": int(blob_bytes), "total": int(row_bytes + blob_bytes)}


def _bytes_to_floats(data: bytes) -> list[float]:
    return blocks.bytes_to_ids(data, "d").tolist()
