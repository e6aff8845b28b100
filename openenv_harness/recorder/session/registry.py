"""The registry of a recorder's sessions: create, find, stop, close, and load after a restart (D5).

A session is one rollout: one agent, one secret, one stream of records (its spec:
``session/spec.py``; its live state: ``session/live.py``). The registry keeps what the hot path
needs in memory -- counters, never history -- and persists identity and outcome so a restarted
recorder keeps serving the same sessions.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
import time

from openenv_harness.recorder.auth import new_secret, secret_digest
from openenv_harness.recorder.session.call_numbers import CallNumbers
from openenv_harness.recorder.session.live import LiveSession
from openenv_harness.recorder.session.spec import SessionSpec
from openenv_harness.recorder.store.base import RecordStore
from openenv_harness.recorder.upstream.span_budget import SpanBudget

_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
#: How long a close lets calls in flight finish before cancelling them (seconds; per close: ``grace_s``).
DEFAULT_CLOSE_GRACE_S = 10.0
#: How long a close then waits for the cancelled calls and those past the engine to be recorded; a
#: record journalled by then is part of the session, any later append is refused by the sealed store.
CANCELLED_CALLS_WAIT_S = 30.0


class SessionError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class SessionRegistry:
    """All sessions of this recorder, by id and by secret digest.

    Two threads use it: the chat loop's (agent calls, the main port's admin routes) and the admin
    listener's (``admin_listener.py``: session create and close on a port of their own). ``_lock``
    makes each change of the maps and each start of a close one step for both; lookups (``get``,
    ``by_digest``) are single dict reads, atomic in CPython, and stay lock-free on the chat path.
    """

    def __init__(self, store: RecordStore, span_budget: SpanBudget | None = None) -> None:
        self._store = store
        #: the recorder's bound on the prompt bytes its sessions keep, handed to each session it makes
        self._span_budget = span_budget
        self._by_id: dict[str, LiveSession] = {}
        self._by_digest: dict[str, LiveSession] = {}
        #: ids handed out by ``new`` and not yet added (or abandoned): a second create of one gets 409
        self._reserved: set[str] = set()
        self._lock = threading.Lock()
        #: the chat loop (set when the recorder starts): a session's calls, and the asyncio primitives
        #: a close waits on, live there; a close from another loop hops to it when it must wait
        self.loop: asyncio.AbstractEventLoop | None = None

    def load(self) -> int:
        """Re-create live sessions from the store (after a restart). Returns how many."""
        for row in self._store.load_sessions():
            spec = SessionSpec.model_validate(row.spec)
            session = LiveSession(
                id=row.session_id,
                secret_digest=row.secret_digest,
                spec=spec,
                created_at=row.created_at,
                status=row.status,
                closed_at=row.closed_at,
                stop_reason=row.stop_reason,
                numbers=CallNumbers(row.next_call_index),
                restore_pending=row.next_call_index > 0 and row.status != "closed",
                span_budget=self._span_budget,
            )
            state = row.state or {}
            session.last_error = state.get("last_error")
            session.template_status = state.get("template_status")
            session.template_fingerprint = state.get("template_fingerprint")
            session.template_certification = state.get("template_certification")
            session.engine_version = state.get("engine_version")
            session.logprobs_mode = state.get("logprobs_mode")
            session.outcome = state.get("outcome")
            session.ledger.restore(state.get("totals") or {})
            if session.status == "closed":
                self._store.seal(session.id)
            self._index(session)
        return len(self._by_id)

    def _index(self, session: LiveSession) -> None:
        with self._lock:
            self._by_id[session.id] = session
            self._by_digest[session.secret_digest] = session
            self._reserved.discard(session.id)

    def _reserve(self, session_id: str) -> bool:
        with self._lock:
            if session_id in self._by_id or session_id in self._reserved:
                return False
            self._reserved.add(session_id)
            return True

    def new(self, spec: SessionSpec) -> tuple[LiveSession, str]:
        """Create (not yet persisted) a session and its secret; its id is reserved until ``add`` or
        ``abandon``, so two creates of one id never both succeed, from one listener or two."""
        if spec.session_id is not None:
            if not _SESSION_ID.match(spec.session_id):
                raise SessionError(422, "session_id must be 1-96 characters of [A-Za-z0-9_.-]")
            if not self._reserve(spec.session_id):
                raise SessionError(409, f"session {spec.session_id!r} already exists")
            session_id = spec.session_id
        else:
            session_id = "s-" + secrets.token_hex(8)
            while not self._reserve(session_id):  # 64 random bits: a repeat is not expected
                session_id = "s-" + secrets.token_hex(8)
        if spec.affinity_key is None:
            # opaque and fresh: not the session id, which a trainer may reuse across runs
            spec = spec.model_copy(update={"affinity_key": "t-" + secrets.token_hex(12)})
        secret = new_secret()
        session = LiveSession(id=session_id, secret_digest=secret_digest(secret), spec=spec, created_at=time.time(),
                              span_budget=self._span_budget)
        return session, secret

    def abandon(self, session: LiveSession) -> None:
        """A session ``new`` made that will not be added (its create failed): free its id."""
        with self._lock:
            self._reserved.discard(session.id)

    async def add(self, session: LiveSession) -> None:
        try:
            await self._store.put_session(session.to_row())
        except BaseException:
            self.abandon(session)
            raise
        self._index(session)

    async def persist(self, session: LiveSession) -> None:
        await self._store.put_session(session.to_row())

    def get(self, session_id: str) -> LiveSession | None:
        return self._by_id.get(session_id)

    def by_digest(self, digest: str) -> LiveSession | None:
        return self._by_digest.get(digest)

    def all(self) -> list[LiveSession]:
        with self._lock:
            return list(self._by_id.values())

    async def stop(self, session: LiveSession, reason: str) -> None:
        """A budget was hit: further calls are refused, the session stays readable."""
        if session.status == "open":
            session.status = "stopped"
            session.stop_reason = reason
            await self.persist(session)
            session.notify()

    async def close(self, session: LiveSession, reason: str | None = None, *,
                    grace_s: float = DEFAULT_CLOSE_GRACE_S) -> None:
        """Close a session; once this returns its records never change (RFC 001, "Closing a session").

        1. No new call is served (409 ``session_closed``).
        2. Calls in flight may finish, for up to ``grace_s``: each is recorded as usual, classified
           against its chain.
        3. Calls still waiting then (on the engine, on a paused fence, on a twin) are cancelled: one
           that reached the engine is recorded as ``failed`` with error kind ``cancelled`` (never
           trainable), and its agent gets a 409; calls already past the engine are waited for.
        4. The store is sealed for the session -- an append is refused from here on -- and only then
           is the session marked closed and its caches dropped.
        A second close waits for the first.

        From another thread's loop (the admin listener): a session with no call in flight is sealed
        and persisted right there -- a call admitted from then on sees ``closing`` (``flow.handle_chat``
        checks it again after registering the call) -- and only the wake-ups go to the chat loop; a
        session with calls in flight, or a close already under way, hops to the chat loop and waits.
        """
        home = self.loop
        here = asyncio.get_running_loop()
        if home is None or home is here:
            await self._close_here(session, grace_s)
            return
        if session.status == "closed":
            return
        with self._lock:
            began = session._close_done is None
            if began:
                session._close_done = home.create_future()  # resolved on the chat loop, where waiters are
        if began and not session.calls:  # read after closing was set: a call registered later refuses itself
            try:
                await self._finish(session)
            finally:
                home.call_soon_threadsafe(self._closed, session)
            return
        work = self._drain_and_finish(session, grace_s) if began else self._close_here(session, grace_s)
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, home))

    async def _close_here(self, session: LiveSession, grace_s: float) -> None:
        if session.status == "closed":
            return
        with self._lock:
            began = session._close_done is None
            if began:
                session._close_done = asyncio.get_running_loop().create_future()
        if not began:
            assert session._close_done is not None
            await asyncio.shield(session._close_done)
            return
        await self._drain_and_finish(session, grace_s)

    async def _drain_and_finish(self, session: LiveSession, grace_s: float) -> None:
        """Steps 2-4 on the chat loop, where the session's calls and their primitives live."""
        try:
            if not await session.calls_done(grace_s):
                for flow in list(session.calls.values()):
                    flow.cancel_for_close()
                await session.calls_done(CANCELLED_CALLS_WAIT_S)  # they record and answer at once
            await self._finish(session)
        finally:
            self._closed(session)

    async def _finish(self, session: LiveSession) -> None:
        """Step 4: seal, mark closed, drop the caches, persist. Thread-agnostic: the store's writes
        are under its own locks, and no call of the session runs any more."""
        self._store.seal(session.id)
        session.status = "closed"
        session.closed_at = time.time()
        # a closed session serves no more calls: its bounded caches go (memory follows live sessions)
        session.release_caches()
        await self.persist(session)
        await self._store.forget(session.id)

    @staticmethod
    def _closed(session: LiveSession) -> None:
        """On the chat loop: wake the session's waiters and any second close."""
        session.notify()
        assert session._close_done is not None
        if not session._close_done.done():
            session._close_done.set_result(None)
