"""The rules every assembled trace obeys; the assembler checks them before handing a trace out.

Why a separate module: the rules are the contract with the trainer, and a trainer (or a test) may
want to check a trace that came from elsewhere. Structural rules need only the trace. Identity
rules need the calls it was built from:

- every segment's sampled ids equal the call's sampled ids (a partial segment: their prefix), and
  mask 1 sits exactly on the trainable ones;
- every segment carries its call's policy versions, and the trace's summary (oldest start, newest
  end, any straddle) is the one its segments give;
- unless the trace is labelled ``approximate``: the tokens before each segment equal that call's
  canonical prompt (every mask-1 token has the context the engine saw), and the trace ends with
  its last call's sampled ids -- so ``prompt_ids + response_ids`` equals the last call's prompt +
  completion, token for token.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from openenv_harness.assembly.calls import Call
from openenv_harness.assembly.errors import AssemblyError
from openenv_harness.assembly.tokens import WIDTH, pack_ids, starts_with_at
from openenv_harness.assembly.trace import HarnessTrace


def _label(trace: HarnessTrace) -> str:
    md = trace.metadata
    return f"trace chain={md.chain_id} sample={md.sample_index}"


def check_structure(trace: HarnessTrace) -> None:
    """Aligned lengths, 0/1 mask, real logprobs under mask 1, 0.0 filler under mask 0, sane segments."""
    label = _label(trace)
    n = len(trace.response_ids)
    if not trace.prompt_ids:
        raise AssemblyError(f"{label}: prompt_ids is empty")
    if len(trace.loss_mask) != n or len(trace.response_logprobs) != n:
        raise AssemblyError(
            f"{label}: misaligned arrays: response_ids={n} loss_mask={len(trace.loss_mask)} "
            f"response_logprobs={len(trace.response_logprobs)}"
        )
    for position, (flag, logprob) in enumerate(zip(trace.loss_mask, trace.response_logprobs, strict=True)):
        if flag == 1:
            if not (math.isfinite(logprob) and logprob <= 0.0):
                raise AssemblyError(f"{label}: mask-1 position {position} has logprob {logprob!r} (needs finite <= 0)")
        elif flag == 0:
            if logprob != 0.0:
                raise AssemblyError(f"{label}: mask-0 position {position} has logprob {logprob!r} (filler must be 0.0)")
        else:
            raise AssemblyError(f"{label}: loss_mask position {position} is {flag!r} (must be 0 or 1)")
    if trace.reward is not None and not math.isfinite(trace.reward):
        raise AssemblyError(f"{label}: reward {trace.reward!r} is not finite (use None for unscored)")
    end = 0
    for segment in trace.metadata.segments:
        if segment.offset < end or segment.offset + segment.length > n:
            raise AssemblyError(f"{label}: segment {segment.node_id} overlaps another or runs past response_ids")
        if segment.trainable_tokens > segment.length:
            raise AssemblyError(f"{label}: segment {segment.node_id} claims more trainable tokens than it holds")
        end = segment.offset + segment.length
    if trace.metadata.trainable_tokens != sum(trace.loss_mask):
        raise AssemblyError(f"{label}: metadata.trainable_tokens disagrees with loss_mask")
    _check_version_summary(trace, label)


def _check_version_summary(trace: HarnessTrace, label: str) -> None:
    """The sample's versions summarize its segments': a staleness filter reads only the summary."""
    md, segments = trace.metadata, trace.metadata.segments
    if not segments:
        return
    straddled = [s.node_id for s in segments if s.straddled_sync]
    summary = (md.policy_version_start, md.policy_version_end, md.straddled_sync, md.straddled_node_ids)
    expected = (min(s.policy_version_start for s in segments), max(s.policy_version_end for s in segments),
                bool(straddled), straddled)
    if summary != expected:
        raise AssemblyError(f"{label}: policy versions {summary} disagree with its segments' {expected}")


def check_identity(trace: HarnessTrace, calls: Mapping[str, Call]) -> None:
    """Token identity with the recorded calls (see the module docstring)."""
    label = _label(trace)
    segments = trace.metadata.segments
    if not segments:
        raise AssemblyError(f"{label}: no sampled span")
    full = pack_ids(trace.prompt_ids) + pack_ids(trace.response_ids)
    base = len(trace.prompt_ids)
    expected_mask = [0] * len(trace.response_ids)
    for segment in segments:
        call = calls.get(segment.node_id)
        if call is None:
            raise AssemblyError(f"{label}: segment names unknown call {segment.node_id!r}")
        start = base + segment.offset
        if segment.partial:  # a realigned call's exact prefix
            sampled = call.completion_bytes[: segment.length * WIDTH]
            whole = segment.length <= len(call.completion)
        else:
            sampled, whole = call.completion_bytes, segment.length == len(call.completion)
        if not whole or not starts_with_at(full, sampled, start):
            raise AssemblyError(f"{label}: sampled ids of {call.node_id} are not reproduced verbatim")
        expected_mask[segment.offset : segment.offset + segment.length] = call.mask[: segment.length]
        v = call.versions
        if (segment.policy_version_start, segment.policy_version_end, segment.straddled_sync) != (
                v.policy_version_start, v.policy_version_end, v.straddled_sync):
            raise AssemblyError(f"{label}: segment {call.node_id} does not carry its call's policy versions")
        if trace.metadata.approximate:
            continue
        if start != len(call.prompt) or not full.startswith(call.prompt_bytes):
            raise AssemblyError(
                f"{label}: the context of {call.node_id}'s sampled ids differs from the prompt the engine saw"
            )
    if trace.loss_mask != expected_mask:
        raise AssemblyError(f"{label}: loss_mask is not 1 exactly on the trainable sampled ids")
    last = segments[-1]
    if not trace.metadata.approximate and base + last.offset + last.length != len(full) // WIDTH:
        raise AssemblyError(f"{label}: trace does not end with its last call's sampled ids")


def check_trace(trace: HarnessTrace, calls: Mapping[str, Call] | None = None) -> None:
    """All rules; identity rules only when the calls the trace was built from are given."""
    check_structure(trace)
    if calls is not None:
        check_identity(trace, calls)


def check_traces(traces: Iterable[HarnessTrace], calls: Iterable[Call]) -> None:
    """Check a session's traces against its calls."""
    by_node = {call.node_id: call for call in calls}
    for trace in traces:
        check_trace(trace, by_node)
