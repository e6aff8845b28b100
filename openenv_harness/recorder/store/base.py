"""What the recorder needs from durable storage, and the shapes that cross that boundary.

Why a small interface: the flow only ever does three things with storage -- persist a session,
append one call, read a session back -- and it must be able to *await* the append, because D14
says no reply leaves before its record is durable. Backends (SQLite by default) decide how.
"""

from __future__ import annotations

import abc
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


class SessionSealed(RuntimeError):
    """An append for a session that was closed: its records are final (``RecordStore.seal``)."""


@dataclass
class PendingRecord:
    """One call, ready to be stored. Token arrays are already validated ``array`` objects.

    ``request`` is the agent's parsed body; ``response`` the engine's reply without the engine-only
    token fields (those travel in the arrays). ``metadata`` has everything but ``seq``, which the
    store assigns. ``request_json``, when set, must decode to ``request``.
    """

    session_id: str
    call_index: int
    call_kind: str
    status: str
    request: dict[str, Any]
    response: dict[str, Any]
    prompt_ids: array[int] | None
    completion_ids: array[int] | None
    logprobs: array[float] | None
    completion_tokens: list[str] | None
    trainable: bool
    metadata: dict[str, Any]
    created_at: float
    #: ``request`` exactly as the agent sent it, when the caller has those bytes (saves a re-encode)
    request_json: bytes | None = None


@dataclass
class SessionRow:
    """The durable part of a session: enough to keep serving it after a restart."""

    session_id: str
    secret_digest: str
    status: str
    created_at: float
    spec: dict[str, Any]
    closed_at: float | None = None
    stop_reason: str | None = None
    state: dict[str, Any] = field(default_factory=dict)
    next_call_index: int = 0


class RecordStore(abc.ABC):
    """Durable storage for sessions and call records."""

    @abc.abstractmethod
    def open(self) -> None:
        """Open or create the store (called once, before serving)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and close."""

    @abc.abstractmethod
    async def append(self, record: PendingRecord) -> int:
        """Store one call; returns its server sequence number once it is durable."""

    @abc.abstractmethod
    async def put_session(self, row: SessionRow) -> None:
        """Insert or replace a session row; returns once durable."""

    async def forget(self, session_id: str) -> None:
        """A session is finished: drop any per-session cache (optional for backends)."""

    @abc.abstractmethod
    def load_sessions(self) -> list[SessionRow]:
        """All sessions, with ``next_call_index`` recovered from the stored records."""

    @abc.abstractmethod
    async def read_records(self, session_id: str, *, after_seq: int = 0) -> list[dict[str, Any]]:
        """A session's records as ``TraceEntry`` dicts, in sequence order."""

    def iter_records(self, session_id: str, *, after_seq: int = 0) -> Iterator[dict[str, Any]]:
        """``read_records`` one record at a time, synchronously (for exports that stream); call
        ``caught_up`` first. A backend that cannot read that way leaves this unimplemented."""
        raise NotImplementedError(f"{type(self).__name__} cannot stream records")

    async def caught_up(self) -> None:
        """Return once every record appended so far is visible to readers (a no-op where it always is)."""

    @abc.abstractmethod
    async def find_by_digest(self, session_id: str, request_digest: str) -> dict[str, Any] | None:
        """The most recent successful record of a session for a request digest (retry replay)."""

    @abc.abstractmethod
    def stats(self) -> dict[str, Any]:
        """Counters for metrics (records, bytes, ...)."""

    def seal(self, session_id: str) -> None:
        """The session is closed: refuse any append for it from now on (``SessionSealed``). Once
        this returns, no record of the session can be made durable any more."""

    def failure(self) -> str | None:
        """Why the store cannot take records now (every append would fail), or None when it can.
        The health probes and the metrics report it; the flow refuses calls before the engine."""
        return None

    async def recover(self) -> bool:
        """Make a failed store take records again without a restart, where that is safe; True if it
        did something. Backends that cannot fail this way have nothing to do."""
        return False
