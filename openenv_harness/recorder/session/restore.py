"""A recovered session's chain state, rebuilt once from its durable records.

Why: two things that follow a chain live only in memory -- the fidelity tips (``chain/fidelity.py``: the
last prompt and sampled completion of each chain tip) and the dialects' replay memory
(``dialects/memory.py``: the sampled tool-argument text and reasoning behind what a Responses or
Messages reply handed out). Lost at a restart, the session's next call would be labelled ``root``
though it continues a chain, and a Claude Code turn replayed as a parsed ``input`` object or a
thinking block kept only by its ``signature`` (a Codex reasoning item by its
``encrypted_content``) could no longer be turned back into what the model sampled. The records
hold all of it: each one's prompt and completion ids, ``metadata.fidelity`` where the tracker saw
it, and for dialect calls the reply sent (``response``) with its ``metadata.sampled_arguments``.

So a session the registry recovered with records (``LiveSession.restore_pending``) is rebuilt
before its first call after the restart is served, and only then: every record is fed, in
order, to a fresh tracker (those the tracker observed live) and to its dialect's ``remember``
(the reply built again the way it first left and dropped, so the memory holds the same entries).
Both stay bounded as live (``MAX_TIPS`` tips; the memory's own entry and byte limits, oldest out
first). The records are streamed one at a time on a worker thread, off the event loop; calls of
the session that arrive meanwhile wait for the same rebuild. A store that cannot be read leaves the
state empty: the next transition shows what it costs, never a wrong prompt.

The same pass gives back the retry window's recent digests (``session/replay_window.py``): an agent that
retries a call it sent before the restart is answered from that call's record, as it would have
been without the restart, instead of being sampled a second time.
"""

from __future__ import annotations

import asyncio
import logging
from array import array
from collections import deque
from collections.abc import Iterable
from typing import Any, NamedTuple

from openenv_harness.recorder.chain.fidelity import FidelityTracker
from openenv_harness.recorder.dialects.chat import CHAT
from openenv_harness.recorder.dialects.memory import ReplayMemory
from openenv_harness.recorder.dialects.routes import BY_NAME
from openenv_harness.recorder.session.live import LiveSession
from openenv_harness.recorder.store.base import RecordStore

log = logging.getLogger(__name__)

class Rebuilt(NamedTuple):
    """What a session's records leave behind: its tips, its replay memory (None: nothing to hold) and
    the request digests of its answered calls, oldest first, with their call numbers."""

    tracker: FidelityTracker | None
    memory: ReplayMemory | None
    answered: list[tuple[str, int]]


def rebuild(records: Iterable[dict[str, Any]], window: int = 0) -> Rebuilt:
    """Feed every record, in order, to a fresh tracker and its dialect's memory; keep the last
    ``window`` answered calls' digests (a retry of one is answered from its record: ``call/admit.py: dedupe``)."""
    tracker, memory = FidelityTracker(), ReplayMemory()
    answered: deque[tuple[str, int]] = deque(maxlen=window)
    for record in records:
        md = record.get("metadata") or {}
        if md.get("fidelity") is not None:  # the tracker observed exactly these calls
            tracker.observe(str(md.get("node_id")), array("I", record.get("prompt_token_ids") or []),
                            array("I", record.get("completion_token_ids") or []))
            if md.get("seq") is not None:
                tracker.placed(str(md.get("node_id")), int(md["seq"]))
        dialect = BY_NAME.get(md.get("dialect") or "chat", CHAT)
        if md.get("error") is None and md.get("status") != "failed":
            dialect.remember(record, memory)  # a reply the agent was handed
            if window and isinstance(md.get("request_digest"), str) and isinstance(md.get("call_index"), int):
                answered.append((md["request_digest"], md["call_index"]))
    return Rebuilt(tracker if tracker.tips else None, memory if len(memory) else None, list(answered))


def _read(store: RecordStore, session_id: str, window: int) -> Rebuilt:
    return rebuild(store.iter_records(session_id), window)


async def restore(store: RecordStore, session: LiveSession, window: int = 0) -> None:
    """Rebuild ``session``'s chain state (and the digests of its last ``window`` answered calls) from
    its records if that is still to do; every call of the session waits for the one rebuild."""
    if not session.restore_pending:
        return
    if session.restoring is None:
        session.restoring = asyncio.ensure_future(_restore(store, session, window))
    await asyncio.shield(session.restoring)


async def _restore(store: RecordStore, session: LiveSession, window: int) -> None:
    rebuilt = Rebuilt(None, None, [])
    try:
        await store.caught_up()
        try:
            rebuilt = await asyncio.to_thread(_read, store, session.id, window)
        except NotImplementedError:  # a backend that cannot stream: read whole
            rebuilt = await asyncio.to_thread(rebuild, await store.read_records(session.id), window)
    except Exception:
        log.warning("recorder: could not rebuild session %s's chain state from its records", session.id,
                    exc_info=True)
    if rebuilt.tracker is not None:
        session.chain.adopt(rebuilt.tracker)
    if rebuilt.memory is not None:
        session.dialect_memory.absorb(rebuilt.memory)
    for digest, index in rebuilt.answered:
        session.replay.remember(digest, index, window)
    session.restore_pending = False


async def read_tip_prompts(store: RecordStore, session_id: str, need: dict[str, int]) -> dict[str, bytes]:
    """Sketched chain tips' prompts, read back from their records: ``{node_id: prompt bytes}``.

    Why: a tracker under the recorder's budget keeps an idle session's tips as digests
    (``chain/fidelity.py``); a break whose divergence lies inside one of their blocks needs the prompt
    whole to say where. Rare (a break, in a session that was idle), so one read
    per tip, by its record's seq. A tip that cannot be read is left out: its divergence position is
    then the start of the block where the prompts part -- the class and the parent stay right.
    """
    out: dict[str, bytes] = {}
    try:
        await store.caught_up()
        for node_id, seq in need.items():
            try:
                record = await asyncio.to_thread(_first_record, store, session_id, seq)
            except NotImplementedError:  # a backend that cannot stream
                records = await store.read_records(session_id, after_seq=seq - 1)
                record = records[0] if records else None
            md = (record or {}).get("metadata") or {}
            if record is not None and md.get("node_id") == node_id:
                out[node_id] = array("I", record.get("prompt_token_ids") or []).tobytes()
    except Exception:
        log.warning("recorder: could not read session %s's chain tips back", session_id, exc_info=True)
    return out


def _first_record(store: RecordStore, session_id: str, seq: int) -> dict[str, Any] | None:
    records = store.iter_records(session_id, after_seq=seq - 1)
    try:
        return next(iter(records), None)
    finally:
        close = getattr(records, "close", None)
        if close is not None:
            close()
