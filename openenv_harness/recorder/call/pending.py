"""The one builder of a call's stored record, whatever became of the call.

- ``ok`` / ``invalid``: the engine answered; the record holds its ids and logprobs, what it applied,
  and whether a trainer may use them;
- aborted: the engine stopped the sample part-way (a pause in abort mode, or its own abort); the
  partial ids are kept for inspection, never trained, and the call is answered with a retryable error;
- ``failed``: no usable answer; the record holds the error and no ids.

Every record's metadata starts from ``base_metadata`` (its number is taken there, and its provenance
built) and ends with the session's ``limits`` once the call was counted against them. The builder
changes nothing but the call's number and the ledger's count (``record.py`` commits the record and
runs what follows a durable one).

Provenance is per call, not per session: the sampling fields differ call by call (an agent's title call
is not its main loop's), and a trainer correcting for truncated sampling needs each call's effective
values. The session's part is built once and reused (``LiveSession.provenance_cache``).
"""

from __future__ import annotations

import time
from typing import Any

from openenv_harness.contract import SCHEMA_VERSION
from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.call.services import CallServices
from openenv_harness.recorder.dialects.sampled import sampled_arguments
from openenv_harness.recorder.engine_knowledge.provenance import DEFAULTED_FIELDS, SAMPLING_FIELDS, decoding_constraint
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.sampling_policy import apply_policy, policy_differences, policy_values
from openenv_harness.recorder.session.live import LiveSession
from openenv_harness.recorder.store.base import PendingRecord
from openenv_harness.recorder.validate import Evidence, agent_view
from openenv_harness.version import __version__

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
    # per-token weight versions when the engine reports them (vLLM 0.33 ``return_weight_versions``:
    # ``choices[0].weight_versions = [{version, start, end}]``)
    choices = (flow.reply.json or {}).get("choices") if flow.reply is not None else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
            and choices[0].get("weight_versions") is not None:
        md["weight_versions"] = choices[0]["weight_versions"]
    if flow.tool_limit is not None:
        md["tool_limit"] = flow.tool_limit
    report = flow.session.prompt_mode.report(flow.mode_call)
    if report is not None:
        md["prompt_mode"] = report
    return md


def served_record(flow: Flow, ev: Evidence, md: dict[str, Any]) -> PendingRecord:
    """An answered call's record, counted against the session's budget; ``flow.agent_reply`` is what
    the agent will be sent (logprobs included when it asked), and what a replayed retry gets."""
    assert flow.reply is not None and flow.reply.json is not None
    response = agent_view(flow.reply.json, keep_logprobs=flow.keep_logprobs)
    if flow.dialect.records_sampled_arguments:
        keep_sampled_arguments(flow, response, md)
    return _pending(flow, md, response, ev, served=True)


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
    if not aborted:
        return _pending(flow, md, {}, None, served=False)
    reply = flow.reply.json if flow.reply is not None else None
    return _pending(flow, md, agent_view(reply, keep_logprobs=False) if reply else {}, ev, served=False)


def was_served(pending: PendingRecord) -> bool:
    """The agent is handed this record's answer (ok or invalid); not a failed or aborted call."""
    return pending.status != "failed" and not pending.metadata.get("partial")


def _pending(flow: Flow, md: dict[str, Any], response: dict[str, Any], ev: Evidence | None, *,
             served: bool) -> PendingRecord:
    """The one place a record is assembled: its status and trainability are the metadata's. The call
    counts against the session's budget here (its ids only when the agent is ``served`` them), and
    the record's ``limits`` show the counts with it."""
    session = flow.session
    session.ledger.account(flow.call_kind, ev if served else None, served=served)
    md["limits"] = session.ledger.limits(time.time() - session.created_at, session.stop_reason)
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


def base_metadata(flow: Flow, status: str, trainable: bool) -> dict[str, Any]:
    """The metadata every record has. The call gets its number here, when its record is built: a call
    that ends without a record (refused, or unstorable: ``commit`` gives the number back)
    uses none, so a session's call numbers are its records' positions, with no gap."""
    session = flow.session
    if flow.call_index < 0:
        flow.call_index = session.numbers.take()
    md = {
        "schema_version": SCHEMA_VERSION,
        "node_id": f"{session.id}/{flow.call_index}",
        "session_id": session.id,
        "call_index": flow.call_index,
        "call_kind": flow.call_kind,
        "aux_rule": flow.aux_rule,
        "status": status,
        "trainable": trainable,
        "stream": flow.wants_stream,
        "policy_version_start": flow.version_start,
        "policy_version_end": flow.version_end,
        "straddled_sync": flow.version_start != flow.version_end,
        "request_digest": flow.digest,
        "harness_session_id": flow.headers.get(flow.dialect.session_header),
        "dialect": flow.dialect.name,
        "received_at": flow.received_at,
        "upstream_ms": flow.reply.elapsed_ms if flow.reply is not None else None,
        "provenance": call_provenance(flow.ctx, session, flow.upstream_body or flow.body, flow.body,
                                      flow.reply.headers if flow.reply is not None else None),
    }
    if flow.engine_paused is not None:
        md["engine_paused"] = flow.engine_paused
    return md


def sampling_provenance(ctx: CallServices, session: LiveSession, agent_body: dict[str, Any],
                        sent_body: dict[str, Any]) -> dict[str, Any]:
    """What sampling the engine really applied: what the agent sent, what the session pinned, what
    the engine defaults to -- and the effective values where all three are known. Never a silent
    guess: with the engine's defaults unknown, the fields it filled in are listed as unknown."""
    agent = {k: agent_body[k] for k in SAMPLING_FIELDS if k in agent_body}
    pinned = dict(session.spec.sampling or {})
    sent = {k: sent_body[k] for k in SAMPLING_FIELDS if k in sent_body}
    # configured (the launcher knows the model folder), else what the engine itself said, else unknown
    defaults = ctx.config.engine_sampling_defaults
    source = "configured" if defaults is not None else "unknown"
    if defaults is None and session.spec.upstream in (None, "default"):
        defaults = ctx.engine_watch.info.get("sampling_defaults")
        source = "probed" if defaults is not None else source
    effective = {k: sent[k] for k in DEFAULTED_FIELDS if k in sent}
    unknown: list[str] = []
    for name in DEFAULTED_FIELDS:
        if name in effective:
            continue
        if defaults is None:
            unknown.append(name)
        elif name in defaults:
            effective[name] = defaults[name]
    # what the session's engine's logprobs are, and how that is known: ``measured`` when the session was
    # created (the default engine, probed), else ``configured`` (declared), else ``unknown``
    if session.logprobs_mode not in (None, "unknown"):
        mode, mode_source = str(session.logprobs_mode), "measured"
    elif ctx.config.engine_logprobs_mode:
        mode, mode_source = ctx.config.engine_logprobs_mode, "configured"
    else:
        mode, mode_source = "unknown", "unknown"
    out = {
        "sampling": sent,
        "sampling_from_agent": agent,
        "sampling_pinned": pinned,
        "engine_sampling_defaults": dict(defaults) if defaults is not None else "unknown",
        "engine_sampling_defaults_source": source,
        "sampling_effective": effective,
        "sampling_unknown": unknown,
        "logprobs_mode": mode,
        "logprobs_mode_source": mode_source,
        "decoding_constraint": decoding_constraint(sent_body),
    }
    policy = session.spec.training_sampling
    if policy is not None:
        out["sampling_policy"] = policy_values(policy.temperature)
        out["sampling_neutralised"] = apply_policy({}, agent_body, policy.temperature)
        out["sampling_policy_differs"] = policy_differences(effective, unknown, mode, policy.temperature)
    return out


def call_provenance(ctx: CallServices, session: LiveSession, sent_body: dict[str, Any],
                    agent_body: dict[str, Any] | None = None, reply_headers: dict[str, str] | None = None
                    ) -> dict[str, Any]:
    # the session-constant part, built on the session's first record
    cached = session.provenance_cache
    if cached is None:
        upstream = ctx.upstream_for(session.spec.upstream)
        cached = {
            "engine": upstream.name if upstream is not None else None,
            "affinity_key": session.spec.affinity_key,
            "engine_version": session.engine_version or ctx.engine_watch.info.get("version"),
            "harness": session.spec.harness,
            "harness_version": session.spec.harness_version,
            "config_hashes": dict(session.spec.config_hashes),
            "template_fingerprint": session.template_fingerprint,
            "template_status": session.template_status,
            "template_certification": session.template_certification,
            "recorder_version": __version__,
        }
        session.provenance_cache = cached
    out = {**cached, "model": sent_body.get("model"),
           **sampling_provenance(ctx, session, agent_body if agent_body is not None else sent_body, sent_body)}
    header = ctx.config.replica_header
    if header and reply_headers:
        # which replica served the call, where the path says (a gateway's header): None otherwise
        out["replica"] = reply_headers.get(header.lower())
    return out
