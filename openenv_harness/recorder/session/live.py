"""One session's live state: identity, counters, stop conditions, and what its calls share (D5, D13).

Bounded: counters and small maps, never history. What a restart must keep is persisted through
``to_row`` (the registry writes it, ``session/registry.py``); the chain state the calls build up is rebuilt
from the records (``session/restore.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from openenv_harness.recorder.chain.observer import ChainObserver
from openenv_harness.recorder.dialects.memory import ReplayMemory
from openenv_harness.recorder.prompt_modes.base import PromptMode
from openenv_harness.recorder.prompt_modes.registry import mode_for
from openenv_harness.recorder.prompt_modes.state import IncrementalState
from openenv_harness.recorder.session.budget import BudgetLedger, Counters
from openenv_harness.recorder.session.call_numbers import CallNumbers
from openenv_harness.recorder.session.replay_window import ReplayWindow
from openenv_harness.recorder.session.spec import SessionSpec
from openenv_harness.recorder.store.base import SessionRow
from openenv_harness.recorder.upstream.reply_parse import PromptIdsReader

if TYPE_CHECKING:
    from openenv_harness.recorder.upstream.span_budget import SpanBudget


class CallInFlight(Protocol):
    """A call being served (``call.flow.Flow``), as a close sees it."""

    def cancel_for_close(self) -> None: ...


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
    #: the next call's number (``session/call_numbers.py``): taken when a record is built, given back when not stored
    numbers: CallNumbers = field(default_factory=CallNumbers)
    last_error: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    template_status: str | None = None
    template_fingerprint: str | None = None
    template_certification: dict[str, Any] | None = None
    engine_version: str | None = None
    #: the engine's logprobs mode when the session was created (measured, else declared, else "unknown")
    logprobs_mode: str | None = None
    #: how the rollout ended, once the trainer scored it: ``{"reward": float | None, "unscored_reason":
    #: str | None}`` (``POST /admin/sessions/{id}/outcome``); exports stamp the reward on every row
    outcome: dict[str, Any] | None = None
    #: retried calls' first attempts: twins in flight and recent records' digests (``session/replay_window.py``)
    replay: ReplayWindow = field(default_factory=ReplayWindow)
    #: how the session's prompts reach the engine (``SessionSpec.prompt_mode``; the strategy is stateless)
    prompt_mode: PromptMode = field(init=False)
    #: the prompt mode's per-session state (incremental: the chain tips' exact ids)
    prompt_mode_state: IncrementalState = field(default_factory=IncrementalState)
    #: the session-constant part of each record's provenance, built on first use
    provenance_cache: dict[str, Any] | None = None
    #: what dialect replies sent back (sampled tool arguments, reasoning), to recognise their replay
    dialect_memory: ReplayMemory = field(default_factory=ReplayMemory)
    #: recovered with records: its chain state (fidelity tips, dialect memory) is still to be rebuilt
    #: from them before its next call (``session/restore.py``); ``restoring`` is that one rebuild
    restore_pending: bool = False
    restoring: asyncio.Future[None] | None = None
    #: the calls being served now, from authentication to reply (``call.flow.Flow`` by id): close waits for them
    calls: dict[int, CallInFlight] = field(default_factory=dict)
    #: the recorder's bound on the prompt bytes sessions keep (``span_budget.py``): the chain observer's
    #: tips and the prompt-id reader's spans are charged to it
    span_budget: InitVar[SpanBudget | None] = None
    #: what the session has spent against its caps (``session/budget.py``), built from the spec with the session
    ledger: BudgetLedger = field(init=False)
    #: the chains its agent calls form: fidelity tips, turn views, compaction summaries (``chain/observer.py``)
    chain: ChainObserver = field(init=False)
    #: the session's recent prompts as text and ids, so a prompt's shared history is not parsed again
    prompt_reader: PromptIdsReader = field(init=False)
    _changed: asyncio.Event | None = None
    _calls_idle: asyncio.Event | None = None
    #: set once a close has begun; resolved when it is done
    _close_done: asyncio.Future[None] | None = None

    def __post_init__(self, span_budget: SpanBudget | None) -> None:
        self.prompt_mode = mode_for(self.spec.prompt_mode)
        self.ledger = BudgetLedger(self.spec.budgets)
        self.chain = ChainObserver(budget=span_budget)
        self.prompt_reader = PromptIdsReader(span_budget)

    def release_caches(self) -> None:
        """The session is closed and serves no more calls: its bounded chain state goes (memory
        follows live sessions); what a restart needs is in the store."""
        self.chain.release()
        self.prompt_reader.release()
        self.replay.forget_recent()
        self.dialect_memory.clear()
        self.provenance_cache = None

    @property
    def counters(self) -> Counters:
        """The ledger's counts, for reading (they change only through ``ledger``'s methods)."""
        return self.ledger.counters

    @property
    def closing(self) -> bool:
        """A close has begun: no new call is served (it may still be waiting for calls in flight)."""
        return self._close_done is not None

    def call_started(self, flow: CallInFlight) -> None:
        self.calls[id(flow)] = flow

    def call_ended(self, flow: CallInFlight) -> None:
        self.calls.pop(id(flow), None)
        if not self.calls and self._calls_idle is not None:
            self._calls_idle.set()

    async def calls_done(self, timeout_s: float) -> bool:
        """Wait until no call is in flight, at most ``timeout_s``; whether none is."""
        if not self.calls:
            return True
        self._calls_idle = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._calls_idle.wait(), timeout_s)
        return not self.calls

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
            "logprobs_mode": self.logprobs_mode,
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
                "logprobs_mode": self.logprobs_mode,
                "outcome": self.outcome,
            },
        )
