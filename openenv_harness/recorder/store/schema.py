"""What the store's SQLite file holds: its tables, and the markers a stored request carries.

Why a module of its own: the indexer's operations (``index_ops.py``) write these rows and the read
side (``reads.py``) turns them back into records; both follow this one description of the file,
and neither is the other's.
"""

from __future__ import annotations

__all__ = ["REF_MESSAGES", "REF_TOOLS", "SCHEMA"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    secret_digest TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    closed_at REAL,
    stop_reason TEXT,
    spec BLOB NOT NULL,
    state BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS blobs (
    hash BLOB PRIMARY KEY,
    data BLOB NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    call_index INTEGER NOT NULL,
    call_kind TEXT NOT NULL,
    status TEXT NOT NULL,
    trainable INTEGER NOT NULL,
    request_digest TEXT NOT NULL,
    created_at REAL NOT NULL,
    prompt_len INTEGER NOT NULL,
    prompt_base INTEGER,
    prompt_shared INTEGER NOT NULL DEFAULT 0,
    prompt_tail BLOB,
    msgs_base INTEGER,
    msgs_shared INTEGER NOT NULL DEFAULT 0,
    msgs BLOB,
    completion_ids BLOB,
    logprobs BLOB,
    completion_tokens BLOB,
    request BLOB NOT NULL,
    response BLOB NOT NULL,
    metadata BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS records_by_session ON records(session_id, seq);
CREATE INDEX IF NOT EXISTS records_by_digest ON records(session_id, request_digest);
"""

#: A stored request's ``messages`` and ``tools`` are replaced by these references: the messages are
#: the record's delta-encoded list of message hashes (``deltas.py``), the tools one blob by its hash.
REF_MESSAGES = "$oeh_messages"
REF_TOOLS = "$oeh_tools"
