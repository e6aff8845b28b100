"""Durable storage for the recorder (SQLite by default)."""

from openenv_harness.recorder.store.base import PendingRecord, RecordStore, SessionRow
from openenv_harness.recorder.store.sqlite import SQLiteStore

__all__ = ["PendingRecord", "RecordStore", "SQLiteStore", "SessionRow"]
