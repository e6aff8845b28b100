"""Sessions from the trainer's side: create one per rollout, read it, wait for it, close it, score it,
and read its records back -- as OpenEnv ``TraceEntry`` dicts or as OpenEnv's own ``TrainingTrace``."""

from __future__ import annotations

import asyncio
import contextlib
import time

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from openenv_harness.recorder.admin.access import context_of, json_response, session_or_404
from openenv_harness.recorder.admin.exact_template import exact_template_refusal
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.exports import records_response, training_trace_response
from openenv_harness.recorder.sampling_policy import refusal as sampling_refusal
from openenv_harness.recorder.session.live import LiveSession
from openenv_harness.recorder.session.registry import SessionError
from openenv_harness.recorder.session.spec import SessionSpec

router = APIRouter()


class OutcomeBody(BaseModel):
    """How a rollout ended, as its trainer scored it: a reward, or why there is none."""

    reward: float | None = Field(None, allow_inf_nan=False, description="The task's reward; null when unscored")
    unscored_reason: str | None = Field(None, max_length=4000, description="Why the rollout has no reward (an "
                                        "infrastructure fault, never a failed task); required when reward is null")


def base_url_for(ctx: RecorderContext, request: Request, session_id: str) -> str:
    """Where the session's agent sends its calls: ``public_base_url``, else the main port as the
    caller addressed this recorder (on the admin listener: the same host, the main port's number)."""
    chat_port = getattr(request.app.state, "chat_port", None)
    base = request.base_url if chat_port is None else request.base_url.replace(port=chat_port)
    root = ctx.config.public_base_url or str(base).rstrip("/")
    return f"{root.rstrip('/')}/rollout/{session_id}/v1"


@router.post("/sessions", status_code=201)
async def create_session(spec: SessionSpec, request: Request) -> Response:
    ctx = context_of(request)
    try:
        session, secret = ctx.sessions.new(spec)
    except SessionError as exc:
        raise HTTPException(status_code=exc.status, detail=exc.message) from None
    try:
        return await _create(ctx, request, spec, session, secret)
    finally:
        if ctx.sessions.get(session.id) is not session:  # refused: its id is free again
            ctx.sessions.abandon(session)


async def _create(ctx: RecorderContext, request: Request, spec: SessionSpec, session: LiveSession,
                  secret: str) -> Response:
    upstream = ctx.upstream_for(spec.upstream)
    if upstream is None:
        raise HTTPException(status_code=422, detail=f"unknown upstream {spec.upstream!r}")
    default = spec.upstream in (None, "default")
    if default:
        if ctx.engine_watch.stale_reason() is not None:  # a probe talks to the engine: on the chat loop
            await ctx.on_chat_loop(ctx.engine_watch.ensure_fresh(upstream))
        if spec.trainer_template_fingerprint is not None:
            # compare with what is served now, not with what was served when last probed
            await ctx.on_chat_loop(ctx.engine_watch.confirm_fingerprint(upstream))
    info = ctx.engine_info if default else {}
    session.engine_version = info.get("version")
    session.logprobs_mode = info.get("logprobs_mode")
    session.template_fingerprint = info.get("template_fingerprint")
    session.template_status = info.get("template_status") or "unverified"
    session.template_certification = info.get("template_certification") or (
        {"status": "uncertified", "reason": "not the default engine: its template is the trainer's own"}
        if not default else {"status": "uncertified", "reason": "template probing is off"})
    refusal = exact_template_refusal(session.template_certification, spec.prompt_mode)
    if refusal and spec.require_exact_template:
        raise HTTPException(status_code=409, detail=refusal)
    warnings: list[str] = []
    if spec.training_sampling is not None:
        mode = session.logprobs_mode or ctx.config.engine_logprobs_mode or "unknown"
        refused = sampling_refusal(spec.training_sampling.temperature, mode)
        if refused:
            raise HTTPException(status_code=409, detail=refused)
        if mode not in ("raw_logprobs", "processed_logprobs") and spec.training_sampling.temperature != 1.0:
            warnings.append(f"the engine's logprobs mode is {mode}: calls at temperature "
                            f"{spec.training_sampling.temperature:g} will be recorded as off the training policy")
    if refusal and session.template_certification.get("properties"):
        # said up front, with the remedy: the records will show the drift or break it causes
        warnings.append(refusal.removeprefix("require_exact_template: "))
    if spec.trainer_template_fingerprint is not None:
        if session.template_fingerprint is None:
            session.template_status = "unverified"
            warnings.append("engine template could not be probed; trainer fingerprint is UNVERIFIED")
        elif session.template_fingerprint != spec.trainer_template_fingerprint:
            raise HTTPException(
                status_code=409,
                detail=(
                    "served chat template differs from the trainer's: engine fingerprint "
                    f"{session.template_fingerprint} != trainer {spec.trainer_template_fingerprint}. "
                    "Serve the template you train with (vLLM --chat-template) or train with the served one."
                ),
            )
        else:
            session.template_status = "verified"
    await ctx.sessions.add(session)
    ctx.metrics.sessions.labels("open").inc()
    return json_response(
        {
            "session_id": session.id,
            "secret": secret,
            "base_url": base_url_for(ctx, request, session.id),
            "affinity_key": session.spec.affinity_key,
            "template_status": session.template_status,
            "template_fingerprint": session.template_fingerprint,
            "template_certification": session.template_certification,
            "warnings": warnings,
        },
        status=201,
    )


@router.get("/sessions")
async def list_sessions(request: Request) -> Response:
    return json_response([s.summary() for s in context_of(request).sessions.all()])


@router.get("/sessions/{session_id}")
async def get_session(session_id: str, request: Request) -> Response:
    return json_response(session_or_404(context_of(request), session_id).summary())


@router.post("/sessions/{session_id}/close")
async def close_session(session_id: str, request: Request,
                        grace_s: float | None = Query(None, ge=0, le=3600)) -> Response:
    """Close a session: calls in flight get up to ``grace_s`` (default ``close_grace_s``) to finish,
    the rest are cancelled and recorded as such; when this answers, the session's records are final."""
    ctx = context_of(request)
    session = session_or_404(ctx, session_id)
    await ctx.sessions.close(session, reason="closed",
                             grace_s=ctx.config.close_grace_s if grace_s is None else grace_s)
    return json_response(session.summary())


@router.post("/sessions/{session_id}/outcome")
async def set_outcome(session_id: str, body: OutcomeBody, request: Request) -> Response:
    """Record how the rollout ended (its reward, or why it has none), durably, beside its records:
    exports then carry the reward with every row. Allowed after close (a closed session refuses
    records, not its own row); a second outcome replaces the first."""
    if body.reward is None and not body.unscored_reason:
        raise HTTPException(422, "an outcome without a reward must say why (unscored_reason)")
    ctx = context_of(request)
    session = session_or_404(ctx, session_id)
    session.outcome = {"reward": body.reward, "unscored_reason": None if body.reward is not None else body.unscored_reason}
    await ctx.store.put_session(session.to_row())
    return json_response(session.summary())


@router.get("/sessions/{session_id}/records")
async def session_records(
    session_id: str,
    request: Request,
    after_seq: int = Query(0, ge=0),
    format: str = Query("json", pattern="^(json|jsonl)$"),
    include: str = Query("all", pattern="^(all|tokens|training)$"),
) -> Response:
    ctx = context_of(request)
    session_or_404(ctx, session_id)
    return await records_response(ctx.store, session_id, after_seq=after_seq, include=include,
                                  jsonl=format == "jsonl")


@router.get("/sessions/{session_id}/training_trace")
async def training_trace(session_id: str, request: Request,
                         non_policy: str = Query("mask", pattern="^(mask|keep)$")) -> Response:
    """OpenEnv's ``TrainingTrace`` of the session's agent calls; ids sampled under a decoding constraint
    (logprobs not the policy's) are mask 0 unless ``non_policy=keep``."""
    ctx = context_of(request)
    session_or_404(ctx, session_id)
    return await training_trace_response(ctx.store, session_id, non_policy)


@router.get("/sessions/{session_id}/wait")
async def wait_session(
    session_id: str,
    request: Request,
    timeout_s: float = Query(30.0, ge=0, le=3600),
    until: str = Query("closed", pattern="^(closed|stopped)$"),
    min_calls: int | None = Query(None, ge=0),
) -> Response:
    """Long-poll until the session is closed (or stopped, or has at least ``min_calls`` calls)."""
    ctx = context_of(request)
    session = session_or_404(ctx, session_id)
    deadline = time.monotonic() + timeout_s

    def done() -> bool:
        if min_calls is not None:
            return session.counters.calls >= min_calls
        if until == "stopped":
            return session.status in ("stopped", "closed")
        return session.status == "closed"

    while not done():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return json_response({**session.summary(), "timed_out": True})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(session.changed.wait(), timeout=remaining)
    return json_response({**session.summary(), "timed_out": False})
