"""Step: one durable record of the call, before the agent gets its reply (D14).

The record's metadata says what the call was (``metadata.py``), what the engine applied, which
budget it spent, how its prompt relates to its chain's (``observe.py``) and how the prompt mode
served it; the store makes it durable (``durable.py``), and only then is the agent's reply fixed.
"""

from __future__ import annotations

import time
from typing import Any

from openenv_harness.recorder.call.durable import store_record
from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.call.metadata import base_metadata
from openenv_harness.recorder.call.observe import observe_cause, observe_fidelity
from openenv_harness.recorder.dialects.sampled import sampled_arguments
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.prompt_modes.registry import mode_for
from openenv_harness.recorder.store.base import PendingRecord
from openenv_harness.recorder.validate import Evidence, agent_view


async def record(flow: Flow) -> None:
    ev = flow.evidence
    assert ev is not None and flow.reply is not None and flow.reply.json is not None
    session = flow.session
    aborted = ev.finish_reason == "abort"
    if aborted:  # a pause in abort mode, or the engine's own abort: the sample stopped part-way
        ev.reasons.append("engine aborted the call (finish_reason=abort): a partial sample, kept for inspection")
    trainable = ev.valid and flow.call_kind == "agent"
    status = "ok" if ev.valid else "invalid"
    md = base_metadata(flow, status, trainable)
    md["invalid_reasons"] = list(ev.reasons)
    md["finish_reason"] = ev.finish_reason
    md["usage"] = ev.usage
    md["partial"] = aborted
    constraint = md["provenance"]["decoding_constraint"]
    # under a decoding constraint the engine's logprobs are taken after its mask: a trainer must
    # exclude or correct these calls' logprobs (the sampled ids are still what was sampled)
    md["logprobs_are_policy"] = constraint is None
    off_policy = md["provenance"].get("sampling_policy_differs")
    if off_policy and trainable:
        # sampled from another distribution than the session's training policy: kept, never trained
        trainable = md["trainable"] = False
        md["sampling_off_policy"] = off_policy
    weight_versions = _weight_versions(flow.reply.json)
    if weight_versions is not None:
        md["weight_versions"] = weight_versions
    if flow.tool_limit is not None:
        md["tool_limit"] = flow.tool_limit
    mode = mode_for(session.spec.prompt_mode)
    report = mode.report(flow)
    if report is not None:
        md["prompt_mode"] = report
    if md["straddled_sync"]:
        flow.ctx.metrics.straddled.inc()
    if aborted:
        await _record_aborted(flow, ev, md, status)
        return
    if flow.call_kind == "agent" and ev.prompt_ids is not None and ev.completion_ids is not None:
        transition = await observe_fidelity(flow, md["node_id"], ev.prompt_ids, ev.completion_ids)
        md["fidelity"] = transition.as_dict()
        if transition.fidelity != "root":
            flow.ctx.metrics.transitions.labels(transition.fidelity).inc()
        observe_cause(flow, md, transition, ev)
    elif flow.call_kind == "aux" and flow.aux_rule and "compaction" in flow.aux_rule:
        summary = _reply_text(flow.reply.json)
        if summary:
            session.compaction_summaries.append(summary)
    session.ledger.account(flow.call_kind, ev, served=True)
    md["limits"] = session.limits()
    flow.metadata = md
    # what the agent is sent, logprobs included when it asked: a replayed retry is answered with it
    response = agent_view(flow.reply.json, keep_logprobs=flow.keep_logprobs)
    if flow.dialect.records_sampled_arguments:
        keep_sampled_arguments(flow, response, md)
    pending = PendingRecord(
        session_id=session.id,
        call_index=flow.call_index,
        call_kind=flow.call_kind,
        status=status,
        request=flow.body,
        request_json=flow.raw,
        response=response,
        prompt_ids=ev.prompt_ids,
        completion_ids=ev.completion_ids,
        logprobs=ev.logprobs,
        completion_tokens=ev.completion_tokens,
        trainable=trainable,
        metadata=md,
        created_at=time.time(),
    )
    seq = await store_record(flow, pending)
    if session.fidelity is not None and "fidelity" in md:
        session.fidelity.placed(md["node_id"], seq)  # its prompt can be read back from here on
    flow.ctx.metrics.records.inc()
    flow.ctx.metrics.calls.labels(flow.call_kind, status).inc()
    if not ev.valid:
        session.ledger.note_invalid()
    session.replay.remember(flow.digest, flow.call_index, flow.ctx.config.dedupe_window)
    flow.agent_reply = response
    mode.committed(flow)


def keep_sampled_arguments(flow: Flow, response: dict[str, Any], metadata: dict[str, Any]) -> None:
    """The argument text the model sampled for each tool call the agent is handed (``sampled.py``),
    for the dialect's reply and, as ``metadata.sampled_arguments``, for the record.

    Why in the record: the text is found in the engine reply's logprob entries, which the record
    does not keep (its ``response`` is the agent's view; its ids need the engine's tokenizer to be
    text again). A restarted recorder rebuilds the replay memory from it (``restore.py``)."""
    assert flow.reply is not None
    found = sampled_arguments(flow.reply.json, response)
    if found is None:
        return
    flow.dialect_call.raw_arguments = found
    if any(text is not None for text in found):
        metadata["sampled_arguments"] = found


def _reply_text(reply: dict[str, Any] | None) -> str | None:
    """The text of a chat reply's first choice (what a compaction call summarized the history to)."""
    choices = (reply or {}).get("choices")
    message = choices[0].get("message") if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
        else None
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) and content.strip() else None


def _weight_versions(reply: dict[str, Any]) -> Any:
    """Per-token weight versions when the engine reports them (vLLM 0.33 ``return_weight_versions``:
    ``choices[0].weight_versions = [{version, start, end}]``); None when it does not."""
    choices = reply.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0].get("weight_versions")
    return None


async def _record_aborted(flow: Flow, ev: Evidence, md: dict[str, Any], status: str) -> None:
    """Keep an aborted call's partial ids (untrainable), then tell the agent to retry the whole call.

    Why an error and not the partial answer: handed over, a cut-off reply becomes the agent's next
    history -- a turn the policy never finished. A retryable 503 makes the harness send the call
    again; that retry is not answered from this record (dedupe skips calls that raised)."""
    session = flow.session
    session.ledger.account(flow.call_kind, None, served=False)
    md["limits"] = session.limits()
    md["error"] = {"kind": "engine_aborted", "status": 503, "upstream_status": flow.reply.status if flow.reply else None,
                   "message": "the engine aborted the call part-way (finish_reason=abort)", "upstream_body": None}
    flow.metadata = md
    pending = PendingRecord(
        session_id=session.id, call_index=flow.call_index, call_kind=flow.call_kind, status=status,
        request=flow.body, request_json=flow.raw,
        response=agent_view(flow.reply.json, keep_logprobs=False) if flow.reply and flow.reply.json else {},
        prompt_ids=ev.prompt_ids, completion_ids=ev.completion_ids, logprobs=ev.logprobs,
        completion_tokens=ev.completion_tokens, trainable=False, metadata=md, created_at=time.time(),
    )
    await store_record(flow, pending)
    session.ledger.note_invalid()
    session.note_error({**md["error"], "call_index": flow.call_index, "at": time.time()})
    flow.ctx.metrics.records.inc()
    flow.ctx.metrics.calls.labels(flow.call_kind, status).inc()
    flow.ctx.metrics.errors.labels("engine_aborted").inc()
    raise AgentError(503, "the engine aborted this call part-way (a weight update or an engine abort); "
                     "retry the call", type="server_error", code="engine_aborted",
                     headers={"retry-after": str(flow.ctx.config.retry_after_s)})
