"""Live session state: identity, budgets, counters and stop conditions (D5, D13).

A session is one rollout: one agent, one secret, one stream of records. The registry keeps what
the hot path needs in memory -- counters, never history -- and persists identity and outcome so a
restarted recorder keeps serving the same sessions.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from openenv_harness.recorder.auth import new_secret, secret_digest
from openenv_harness.recorder.store.base import RecordStore, SessionRow

_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
#: How long a close lets calls in flight finish before cancelling them (seconds; per close: ``grace_s``).
DEFAULT_CLOSE_GRACE_S = 10.0
#: How long a close then waits for the cancelled calls and those past the engine to be recorded; a
#: record journalled by then is part of the session, any later append is refused by the sealed store.
CANCELLED_CALLS_WAIT_S = 30.0


class Budgets(BaseModel):
    """Caps enforced before each call is served (D13). ``None`` means no cap."""

    model_config = ConfigDict(extra="forbid")

    max_agent_calls: int | None = Field(None, ge=0)
    max_calls: int | None = Field(None, ge=0, description="All calls, aux included")
    max_prompt_tokens: int | None = Field(None, ge=0, description="Cumulative prompt tokens")
    max_completion_tokens: int | None = Field(None, ge=0, description="Cumulative completion tokens")
    max_total_tokens: int | None = Field(None, ge=0)
    max_wall_clock_s: float | None = Field(None, gt=0)
    max_tool_calls_per_turn: int | None = Field(
        None, ge=0, description="Tool calls one reply may hand the agent; the rest are dropped, the session goes on"
    )
    max_total_tool_calls: int | None = Field(
        None, ge=0, description="Tool calls handed to the agent in all; the reply that would pass it is cut and"
        " stops the session"
    )


class AuxRule(BaseModel):
    """Marks a call as ``aux`` when every given condition holds."""

    model_config = ConfigDict(extra="forbid")

    name: str
    no_tools: bool | None = None
    system_prompt_startswith: str | None = None
    system_prompt_contains: str | None = None
    last_user_message_startswith: str | None = None
    model: str | None = None


class SessionSpec(BaseModel):
    """What a trainer gives when creating a session."""

    model_config = ConfigDict(extra="forbid")

    session_id: str | None = Field(None, description="Requested id; must be unused")
    metadata: dict[str, Any] = Field(default_factory=dict)
    budgets: Budgets = Field(default_factory=Budgets)
    harness: str | None = None
    harness_version: str | None = None
    config_hashes: dict[str, str] = Field(default_factory=dict)
    aux_rules: list[AuxRule] | None = Field(None, description="Override the harness's classification rules")
    trainer_template_fingerprint: str | None = Field(
        None, description="Fingerprint of the chat template the trainer trains with; a mismatch fails creation"
    )
    upstream: str | None = Field(None, description="Named upstream registered with the recorder (white-box)")
    require_exact_template: bool = Field(
        False, description="Refuse the session (409, with the failing property and what to do) unless the served "
        "chat template is certified to keep chains exact")
    prompt_mode: Literal["full_history", "incremental"] = Field(
        "full_history", description="full_history: the agent's messages are rendered in full each call; incremental: "
        "a call that continues its chain is sampled from the exact previous prompt and sampled ids plus the engine's "
        "certified rendering of only the new messages (recorder/prompt_mode.py)")
    prompt_mode_strict: bool = Field(
        False, description="incremental only: reject (409) a call whose continuation is not certain instead of "
        "falling back to full history; a genuine history change still starts a new chain")
    affinity_key: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$",
        description="The trajectory's routing key, sent upstream as X-Session-ID on every engine call of the "
        "session (vllm-router's consistent_hash keeps them on one replica). None: a fresh random key; siblings "
        "and retried rollouts are sessions of their own and get keys of their own")
    sampling: dict[str, Any] | None = Field(
        None,
        description=(
            "Trainer-pinned sampling fields set on every upstream body (e.g. TRL's training_sampling);"
            " recorded in each record's provenance.sampling"
        ),
    )


@dataclass
class Counters:
    calls: int = 0
    agent_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failed_calls: int = 0
    invalid_calls: int = 0
    replayed_calls: int = 0
    #: tool calls handed to the agent (after any cut), the count ``max_total_tool_calls`` caps
    tool_calls: int = 0


@dataclass
class LiveSession:
    """In-memory state of one session. Bounded: counters and small maps, never history."""

    id: str
    secret_digest: str
    spec: SessionSpec
    created_at: float
    status: str = "open"  # open | stopped | closed
    closed_at: float | None = None
    stop_reason: str | None = None
    next_call_index: int = 0
    counters: Counters = field(default_factory=Counters)
    last_error: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    template_status: str | None = None
    template_fingerprint: str | None = None
    template_certification: dict[str, Any] | None = None
    engine_version: str | None = None
    #: how the rollout ended, once the trainer scored it: ``{"reward": float | None, "unscored_reason":
    #: str | None}`` (``POST /admin/sessions/{id}/outcome``); exports stamp the reward on every row
    outcome: dict[str, Any] | None = None
    #: request digest -> future of the in-flight twin (retry de-duplication)
    inflight: dict[str, asyncio.Future] = field(default_factory=dict)
    #: shared per-session state of the fidelity classifier (last prompt of each chain tip, bounded)
    fidelity: Any = None
    #: the session's recent prompts as text and ids, so a prompt's shared history is not parsed again
    prompt_ids: Any = None
    #: per chain tip: its reply and message digests, for the cause of the next call's drift or break
    turn_views: dict[str, Any] = field(default_factory=dict)
    #: the replies of the last few compaction calls: a break whose history carries one was compaction
    compaction_summaries: "deque[str]" = field(default_factory=lambda: deque(maxlen=4))
    #: request digests of recent successful calls, for retry replay (bounded by the dedupe window)
    recent_digests: "OrderedDict[str, int]" = field(default_factory=OrderedDict)
    #: the prompt mode's per-session state (incremental: the chain tips' exact ids)
    prompt_mode_state: Any = None
    #: the session-constant part of each record's provenance, built on first use
    provenance_cache: dict[str, Any] | None = None
    #: the session's caps as each record's ``limits`` shows them (the spec does not change), built on first use
    caps_cache: dict[str, Any] | None = None
    #: what dialect replies sent back (sampled tool arguments, reasoning), to recognise their replay
    dialect_memory: Any = None
    #: recovered with records: its chain state (fidelity tips, dialect memory) is still to be rebuilt
    #: from them before its next call (``restore.py``); ``restoring`` is that one rebuild
    restore_pending: bool = False
    restoring: asyncio.Future | None = None
    #: the calls being served now, from authentication to reply (``flow.Flow`` by id): close waits for them
    calls: dict[int, Any] = field(default_factory=dict)
    _changed: asyncio.Event | None = None
    _calls_idle: asyncio.Event | None = None
    #: set once a close has begun; resolved when it is done
    _close_done: asyncio.Future | None = None

    @property
    def affinity_key(self) -> str | None:
        """The opaque per-trajectory routing key (set at creation, persisted with the spec)."""
        return self.spec.affinity_key

    @property
    def closing(self) -> bool:
        """A close has begun: no new call is served (it may still be waiting for calls in flight)."""
        return self._close_done is not None

    def call_started(self, flow: Any) -> None:
        self.calls[id(flow)] = flow

    def call_ended(self, flow: Any) -> None:
        self.calls.pop(id(flow), None)
        if not self.calls and self._calls_idle is not None:
            self._calls_idle.set()

    async def calls_done(self, timeout_s: float) -> bool:
        """Wait until no call is in flight, at most ``timeout_s``; whether none is."""
        if not self.calls:
            return True
        self._calls_idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._calls_idle.wait(), timeout_s)
        except TimeoutError:
            pass
        return not self.calls

    def take_call_index(self) -> int:
        index = self.next_call_index
        self.next_call_index += 1
        return index

    @property
    def changed(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def notify(self) -> None:
        """Wake waiters (status changed or a call finished)."""
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def note_error(self, error: dict[str, Any]) -> None:
        self.last_error = error
        self.errors.append(error)
        del self.errors[:-20]  # keep the latest few; every one is also in a failed-call record

    def summary(self) -> dict[str, Any]:
        c = self.counters
        return {
            "session_id": self.id,
            "status": self.status,
            "created_at": self.created_at,
            "closed_at": self.closed_at,
            "stop_reason": self.stop_reason,
            "calls": c.calls,
            "agent_calls": c.agent_calls,
            "prompt_tokens": c.prompt_tokens,
            "completion_tokens": c.completion_tokens,
            "failed_calls": c.failed_calls,
            "invalid_calls": c.invalid_calls,
            "replayed_calls": c.replayed_calls,
            "tool_calls": c.tool_calls,
            "last_error": self.last_error,
            "budgets": self.spec.budgets.model_dump(exclude_none=True),
            "metadata": self.spec.metadata,
            "harness": self.spec.harness,
            "affinity_key": self.spec.affinity_key,
            "template_status": self.template_status,
            "template_certification": self.template_certification,
            "engine_version": self.engine_version,
            "outcome": self.outcome,
        }

    def to_row(self) -> SessionRow:
        return SessionRow(
            session_id=self.id,
            secret_digest=self.secret_digest,
            status=self.status,
            created_at=self.created_at,
            spec=self.spec.model_dump(mode="json"),
            closed_at=self.closed_at,
            stop_reason=self.stop_reason,
            state={
                "last_error": self.last_error,
                "template_status": self.template_status,
                "template_fingerprint": self.template_fingerprint,
                "template_certification": self.template_certification,
                "engine_version": self.engine_version,
                "outcome": self.outcome,
            },
        )


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

    def __init__(self, store: RecordStore) -> None:
        self._store = store
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
                next_call_index=row.next_call_index,
                restore_pending=row.next_call_index > 0 and row.status != "closed",
            )
            state = row.state or {}
            session.last_error = state.get("last_error")
            session.template_status = state.get("template_status")
            session.template_fingerprint = state.get("template_fingerprint")
            session.template_certification = state.get("template_certification")
            session.engine_version = state.get("engine_version")
            session.outcome = state.get("outcome")
            totals = state.get("totals") or {}
            for key, value in totals.items():
                if hasattr(session.counters, key):
                    setattr(session.counters, key, int(value))
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
        session = LiveSession(id=session_id, secret_digest=secret_digest(secret), spec=spec, created_at=time.time())
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
        session.fidelity = None
        session.prompt_ids = None
        session.recent_digests.clear()
        session.provenance_cache = None
        session.dialect_memory = None
        session.turn_views.clear()
        session.compaction_summaries.clear()
        await self.persist(session)
        await self._store.forget(session.id)

    @staticmethod
    def _closed(session: LiveSession) -> None:
        """On the chat loop: wake the session's waiters and any second close."""
        session.notify()
        assert session._close_done is not None
        if not session._close_done.done():
            session._close_done.set_result(None)
