"""The provenance one record carries: the engine, harness and template behind the session, and the
sampling the engine really applied to this call.

Why per call and not per session: the sampling fields differ call by call (an agent's title call is
not its main loop's), and a trainer correcting for truncated sampling needs each call's effective
values. The session's part is built once and reused (``LiveSession.provenance_cache``).
"""

from __future__ import annotations

from typing import Any

from openenv_harness.recorder.call.services import CallServices
from openenv_harness.recorder.engine_knowledge.provenance import DEFAULTED_FIELDS, SAMPLING_FIELDS, decoding_constraint
from openenv_harness.recorder.sampling_policy import apply_policy, policy_differences, policy_values
from openenv_harness.recorder.session.live import LiveSession
from openenv_harness.version import __version__


def _session_part(ctx: CallServices, session: LiveSession) -> dict[str, Any]:
    cached = session.provenance_cache
    if cached is None:
        upstream = ctx.upstream_for(session.spec.upstream)
        cached = {
            "engine": upstream.name if upstream is not None else None,
            "affinity_key": session.affinity_key,
            "engine_version": session.engine_version or ctx.engine_info.get("version"),
            "harness": session.spec.harness,
            "harness_version": session.spec.harness_version,
            "config_hashes": dict(session.spec.config_hashes),
            "template_fingerprint": session.template_fingerprint,
            "template_status": session.template_status,
            "template_certification": session.template_certification,
            "recorder_version": __version__,
        }
        session.provenance_cache = cached
    return cached


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
        defaults = ctx.engine_info.get("sampling_defaults")
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
    mode, mode_source = logprobs_mode_of(ctx, session)
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


def logprobs_mode_of(ctx: CallServices, session: LiveSession) -> tuple[str, str]:
    """What the session's engine's logprobs are, and how that is known: ``measured`` when the
    session was created (the default engine, probed), else ``configured`` (declared), else ``unknown``."""
    if session.logprobs_mode not in (None, "unknown"):
        return str(session.logprobs_mode), "measured"
    if ctx.config.engine_logprobs_mode:
        return ctx.config.engine_logprobs_mode, "configured"
    return "unknown", "unknown"


def call_provenance(ctx: CallServices, session: LiveSession, sent_body: dict[str, Any],
                    agent_body: dict[str, Any] | None = None, reply_headers: dict[str, str] | None = None
                    ) -> dict[str, Any]:
    out = {**_session_part(ctx, session), "model": sent_body.get("model"),
           **sampling_provenance(ctx, session, agent_body if agent_body is not None else sent_body, sent_body)}
    header = ctx.config.replica_header
    if header and reply_headers:
        # which replica served the call, where the path says (a gateway's header): None otherwise
        out["replica"] = reply_headers.get(header.lower())
    return out
