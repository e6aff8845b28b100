"""Hold a store's writer at its next append, so tests can see what callers do while indexing lags."""

from __future__ import annotations

import threading

from openenv_harness.recorder.store.sqlite import SQLiteStore


def stall_writer(store: SQLiteStore) -> tuple[threading.Event, threading.Event]:
    """Make the writer wait at each append until ``gate`` is set; ``stalled`` is set once it waits.
    Returns ``(gate, stalled)``; set ``gate`` before closing the store."""
    gate, stalled = threading.Event(), threading.Event()
    real = store._index_ops._op_append

    def slow(conn, item):
        stalled.set()
        gate.wait(30)
        return real(conn, item)

    store._index_ops._op_append = slow  # type: ignore[method-assign]
    return gate, stalled
