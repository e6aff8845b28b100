"""Trainer-side assembly of recorded calls into training samples (RFC 006 ``HarnessTrace``).

Depends only on ``openenv_harness.contract``: a trainer can use it without the recorder, and the
recorder never imports it. Typical use::

    session = assemble_session(entries, strategy="split")
    for trace in session.traces:
        ...  # trace.prompt_ids, trace.response_ids, trace.loss_mask, trace.response_logprobs
    session.stats.trainable_ratio, session.stats.exact, session.stats.replay_drift, session.stats.breaks
"""

from openenv_harness.assembly.assemble import (
    DEFAULT_REALIGN_MAX_TOKENS,
    STRATEGIES,
    AssembledSession,
    assemble_session,
    compare_strategies,
)
from openenv_harness.assembly.calls import (
    Call,
    Selection,
    call_from_entry,
    detect_eot,
    select_calls,
)
from openenv_harness.assembly.chains import (
    BreakCause,
    Chain,
    ChainGrouping,
    Transition,
    TransitionKind,
    group_chains,
)
from openenv_harness.assembly.diagnostics import (
    LogprobDelta,
    Resolutions,
    SessionStats,
    logprob_delta,
    record_logprob_delta,
    summarize_deltas,
    trace_logprob_delta,
)
from openenv_harness.assembly.errors import AssemblyError
from openenv_harness.assembly.invariants import (
    check_structure,
    check_trace,
    check_traces,
)
from openenv_harness.assembly.trace import (
    HarnessTrace,
    Segment,
    Strategy,
    TraceMetadata,
)

__all__ = [
    "DEFAULT_REALIGN_MAX_TOKENS",
    "STRATEGIES",
    "AssembledSession",
    "AssemblyError",
    "BreakCause",
    "Call",
    "Chain",
    "ChainGrouping",
    "HarnessTrace",
    "LogprobDelta",
    "Resolutions",
    "Segment",
    "Selection",
    "SessionStats",
    "Strategy",
    "TraceMetadata",
    "Transition",
    "TransitionKind",
    "assemble_session",
    "call_from_entry",
    "check_structure",
    "check_trace",
    "check_traces",
    "compare_strategies",
    "detect_eot",
    "group_chains",
    "logprob_delta",
    "record_logprob_delta",
    "select_calls",
    "summarize_deltas",
    "trace_logprob_delta",
]
