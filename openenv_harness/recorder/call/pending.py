"""Part of the record step: the one builder of a call's stored record, whatever became of the call.

- ``ok`` / ``invalid``: the engine answered; the record holds its ids and logprobs, what it applied,
  and whether a trainer may use them;
- aborted: the engine stopped the sample part-way (a pause in abort mode, or its own abort); the
  partial ids are kept for inspection, never trained, and the call is answered with a retryable error;
- ``failed``: no usable answer; the record holds the error and no ids.

Every record's metadata starts from ``base_metadata`` (its number is taken there) and ends with the
session's ``limits`` once the call was counted against them. The builder changes nothing but the
call's number and the ledger's count (``commit.py`` says what follows a durable record).
"""

from __future__ import annotations

import time
from typing import Any

from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.call.metadata import base_metadata
from openenv_harness.recorder.dialects.sampled import sampled_arguments
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.prompt_modes.registry import mode_for
from openenv_harness.recorder.store.base import PendingRecord
from openenv_harness.recorder.validate import Evidence, agent_view

#: the error code of a call whose sample the engine aborted (``validate.py`` raises it)
ENGINE_ABORTED = "engine_aborted"


def served_metadata(flow: Flow, ev: Evidence) -> dict[str, Any]:
    """The metadata of a call the engine answered (ok, invalid or aborted), before its chain is observed."""
    aborted = ev.finish_reason == "abort"
    trainable = ev.valid and flow.call_kind == "agent"
    md = base_metadata(flow, "ok" if ev.valid else "invalid", trainable)
    md["invalid_reasons"] = list(ev.reasons)
    md["finish_reason"] = ev.finish_reason
    md["usage"] = ev.usage
    md["partial"] = aborted
    # under a decoding constraint the engine's logprobs are taken after its mask: a trainer must
    # exclude or correct these calls' logprobs (the sampled ids are still what was sampled)
    md["logprobs_are_policy"] = md["provenance"]["decoding_constraint"] is None
    off_policy = md["provenance"].get("sampling_policy_differs")
    if off_policy and trainable:
        # sampled from another distribution than the session's training policy: kept, never trained
        md["trainable"] = False
        md["sampling_off_policy"] = off_policy
    weight_versions = _weight_versions(flow.reply.json if flow.reply is not None else None)
    if weight_versions is not None:
        md["weight_versions"] = weight_versions
    if flow.tool_limit is not None:
        md["tool_limit"] = flow.tool_limit
    report = mode_for(flow.session.spec.prompt_mode).report(flow.mode_call)
    if report is not None:
        md["prompt_mode"] = report
    return md


def served_record(flow: Flow, ev: Evidence, md: dict[str, Any]) -> PendingRecord:
    """An answered call's record, counted against the session's budget; ``flow.agent_reply`` is what
    the agent will be sent (logprobs included when it asked), and what a replayed retry gets."""
    flow.session.ledger.account(flow.call_kind, ev, served=True)
    md["limits"] = flow.session.limits()
    assert flow.reply is not None and flow.reply.json is not None
    response = agent_view(flow.reply.json, keep_logprobs=flow.keep_logprobs)
    if flow.dialect.records_sampled_arguments:
        keep_sampled_arguments(flow, response, md)
    return _pending(flow, md, response, ev)


def failed_record(flow: Flow, error: AgentError, kind: str | None = None) -> PendingRecord:
    """The record of a call that reached the engine but got no usable answer, with the original error.
    An aborted sample keeps its partial ids and what the engine said of it (untrainable)."""
    ev = flow.evidence
    aborted = error.code == ENGINE_ABORTED and ev is not None
    if aborted:
        assert ev is not None
        md = served_metadata(flow, ev)
    else:
        md = base_metadata(flow, "failed", False)
        if flow.mode_call is not None and flow.mode_call.report is not None:
            md["prompt_mode"] = flow.mode_call.report  # incremental: which step of the continuation failed
    md["error"] = {
        "kind": kind or error.code or "upstream",
        "status": error.status,
        "upstream_status": flow.reply.status if flow.reply is not None else None,
        "message": error.message,
        "upstream_body": error.upstream_body,
    }
    flow.session.ledger.account(flow.call_kind, None, served=False)
    md["limits"] = flow.session.limits()
    if not aborted:
        return _pending(flow, md, {}, None)
    reply = flow.reply.json if flow.reply is not None else None
    return _pending(flow, md, agent_view(reply, keep_logprobs=False) if reply else {}, ev)


def was_served(pending: PendingRecord) -> bool:
    """The agent is handed this record's answer (ok or invalid); not a failed or aborted call."""
    return pending.status != "failed" and not pending.metadata.get("partial")


def _pending(flow: Flow, md: dict[str, Any], response: dict[str, Any], ev: Evidence | None) -> PendingRecord:
    """The one place a record is assembled: its status and trainability are the metadata's."""
    return PendingRecord(
        session_id=flow.session.id,
        call_index=flow.call_index,
        call_kind=flow.call_kind,
        status=md["status"],
        request=flow.body,
        request_json=flow.raw if ev is not None else None,
        response=response,
        prompt_ids=ev.prompt_ids if ev is not None else None,
        completion_ids=ev.completion_ids if ev is not None else None,
        logprobs=ev.logprobs if ev is not None else None,
        completion_tokens=ev.completion_tokens if ev is not None else None,
        trainable=md["trainable"],
        metadata=md,
        created_at=time.time(),
    )


def keep_sampled_arguments(flow: Flow, response: dict[str, Any], metadata: dict[str, Any]) -> None:
    """The argument text the model sampled for each tool call the agent is handed (``sampled.py``),
    for the dialect's reply and, as ``metadata.sampled_arguments``, for the record.

    Why in the record: the text is found in the engine reply's logprob entries, which the record
    does not keep (its ``response`` is the agent's view; its ids need the engine's tokenizer to be
    text again). A restarted recorder rebuilds the replay memory from it (``session/restore.py``)."""
    assert flow.reply is not None
    found = sampled_arguments(flow.reply.json, response)
    if found is None:
        return
    flow.dialect_call.raw_arguments = found
    if any(text is not None for text in found):
        metadata["sampled_arguments"] = found


def _weight_versions(reply: dict[str, Any] | None) -> Any:
    """Per-token weight versions when the engine reports them (vLLM 0.33 ``return_weight_versions``:
    ``choices[0].weight_versions = [{version, start, end}]``); None when it does not."""
    choices = (reply or {}).get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0].get("weight_versions")
    return None
