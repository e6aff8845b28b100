"""Part of the record step: the store makes a record durable, or the call is answered with a retryable
error and gives back what it took (its number, its budget)."""

from __future__ import annotations

from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.call.pending import was_served
from openenv_harness.recorder.errors import AgentError, session_closed
from openenv_harness.recorder.store.base import PendingRecord, SessionSealed


async def store_record(flow: Flow, pending: PendingRecord) -> int:
    """Make the record durable. If storage fails, the agent gets a retryable error, never a reply
    whose record might be lost (D14); the engine's sample is dropped with it. A closed session's
    records are final: the store refuses the append (``RecordStore.seal``)."""
    try:
        seq = await flow.ctx.store.append(pending)
    except SessionSealed:
        flow.store_refused = True
        raise session_closed(flow.session, in_flight=True) from None
    except Exception as exc:
        flow.store_refused = True
        flow.ctx.metrics.errors.labels("store_unavailable").inc()
        _unnumber(flow, pending)
        raise AgentError(503, f"the recorder could not store this call ({type(exc).__name__}: {exc}); retry shortly",
                         type="server_error", code="store_unavailable",
                         headers={"retry-after": str(flow.ctx.config.retry_after_s)}) from None
    flow.stored = True
    return seq


def _unnumber(flow: Flow, pending: PendingRecord) -> None:
    """Nothing was stored for this call: it gives its number back and counts against no budget.

    The number can go back only while no later call of the session has taken one; the one case
    where that is not so is two calls of one session whose journal writes overlap (under
    ``sqlite_synchronous=FULL`` the write waits for an fsync) and where the store fails the first
    and takes the second. Everything else is synchronous from numbering to journalling."""
    session = flow.session
    session.numbers.give_back(flow.call_index)
    flow.call_index = -1
    served = was_served(pending)  # counted as ``pending.py`` counted it
    session.ledger.refund(flow.call_kind, flow.evidence if served else None, served=served)
