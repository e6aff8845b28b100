"""The control plane: sessions, records, the weight-sync fence, metrics. Admin token required.

Trainers (and our rollout sessions) create a session per rollout, hand its secret and base URL to
the agent, wait for it, and read its records back -- as OpenEnv ``TraceEntry`` dicts or as OpenEnv's
own validated ``TrainingTrace``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.exports import records_response, training_trace_response
from openenv_harness.recorder.replicas import ReplicaFenceError
from openenv_harness.recorder.live_session import LiveSession
from openenv_harness.recorder.session_spec import SessionSpec
from openenv_harness.recorder.sessions import SessionError
from openenv_harness.recorder.upstream.base import UpstreamFailure


def _ctx(request: Request) -> RecorderContext:
    return request.app.state.ctx


#: The trace viewer's login (``auth.ViewerLogins``, never the admin token) is this HttpOnly,
#: SameSite=Strict cookie.
ADMIN_COOKIE = "oeh_admin"
_READ_METHODS = frozenset({"GET", "HEAD"})


def admin_authorized(request: Request) -> bool:
    """The admin token as a bearer header on any route, or a viewer login's cookie on reads only:
    a browser never holds a credential that can change state (the viewer only reads)."""
    ctx = _ctx(request)
    if ctx.admin_auth.check(request.headers):
        return True
    if request.method not in _READ_METHODS:
        return False
    return ctx.viewer_logins.valid(request.cookies.get(ADMIN_COOKIE))


async def require_admin(request: Request) -> RecorderContext:
    """Every control-plane route's guard. A coroutine on purpose: FastAPI runs a plain function
    dependency in its thread pool, a thread hand-off per admin request for a few microseconds of work."""
    ctx = _ctx(request)
    if not admin_authorized(request):
        raise HTTPException(status_code=401, detail="admin token required (Authorization: Bearer <admin token>)")
    return ctx


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _session_or_404(ctx: RecorderContext, session_id: str) -> LiveSession:
    session = ctx.sessions.get(session_id)
    if session is None:
        raise HTTPException(status_code=404, detail=f"no session {session_id!r}")
    return session


def base_url_for(ctx: RecorderContext, request: Request, session_id: str) -> str:
    """Where the session's agent sends its calls: ``public_base_url``, else the main port as the
    caller addressed this recorder (on the admin listener: the same host, the main port's number)."""
    chat_port = getattr(request.app.state, "chat_port", None)
    base = request.base_url if chat_port is None else request.base_url.replace(port=chat_port)
    root = ctx.config.public_base_url or str(base).rstrip("/")
    return f"{root.rstrip('/')}/rollout/{session_id}/v1"


class VersionBody(BaseModel):
    version: int = Field(ge=0)
    model: str | None = Field(None, description="Serve every call with this model name from now on (LoRA sync)")


class OutcomeBody(BaseModel):
    """How a rollout ended, as its trainer scored it: a reward, or why there is none."""

    reward: float | None = Field(None, allow_inf_nan=False, description="The task's reward; null when unscored")
    unscored_reason: str | None = Field(None, max_length=4000, description="Why the rollout has no reward (an "
                                        "infrastructure fault, never a failed task); required when reward is null")


router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])


@router.get("/health")
async def health(request: Request) -> Response:
    """Everything a person or an orchestrator needs to tell whether calls can be recorded; 503 with
    ``status: store_unavailable`` (and the store's ``failure``) when they cannot."""
    ctx = _ctx(request)
    by_status: dict[str, int] = {}
    for s in ctx.sessions.all():
        by_status[s.status] = by_status.get(s.status, 0) + 1
    store = ctx.store.stats()
    failed = ctx.store.failure() is not None
    return _json({"status": "store_unavailable" if failed else "ok", "sessions": by_status,
                  "fence": ctx.fence.state(), "engine": ctx.engine_info, "store": store,
                  "admin_listener": admin_listener_info(ctx)},
                 status=503 if failed else 200)


def admin_listener_info(ctx: RecorderContext) -> dict[str, Any]:
    """The admin listener's port and URL as this recorder binds it (None when it has none)."""
    listener = ctx.admin_listener
    if listener is None:
        return {"admin_port": None, "admin_url": None}
    return {"admin_port": listener.port, "admin_url": listener.url}


@router.get("/listener")
async def listener(request: Request) -> Response:
    """Where session create and close are served off the chat loop (``RecorderClient`` asks once)."""
    return _json(admin_listener_info(_ctx(request)))


@router.post("/store/recover")
async def store_recover(request: Request) -> Response:
    """Bring a failed store back without restarting the recorder (``RecordStore.recover``): the
    index process is replaced and every record it left unindexed is sent to it again."""
    ctx = _ctx(request)
    recovered = await ctx.store.recover()
    failure = ctx.store.failure()
    return _json({"recovered": recovered, "store": ctx.store.stats()}, status=503 if failure else 200)


#: what to do when a required property fails, by property
_ADVICE = {
    "tool_prefix": "serve a prefix-preserving training template (vLLM --chat-template, e.g. TRL's "
                   "qwen3_training.jinja for Qwen3) or use the incremental prompt mode",
    "assistant_stable": "serve a template that renders earlier assistant turns unchanged (TRL's *_training.jinja "
                        "keep reasoning), or use the incremental prompt mode",
    "turn_start": "use the incremental prompt mode (it continues the model's own ids, so the turn's start is "
                  "never re-rendered)",
    "junction": "serve a template whose assistant turns end the same way every time",
}


def exact_template_refusal(certification: dict[str, Any] | None, prompt_mode: str = "full_history") -> str | None:
    """Why ``require_exact_template`` refuses a session in ``prompt_mode`` (None when the template
    is exact in that mode)."""
    if not certification or (certification.get("status") == "uncertified" and not certification.get("properties")):
        reason = (certification or {}).get("reason", "no certification")
        return (f"require_exact_template: the served template could not be certified ({reason}); an engine with "
                "/tokenize and /detokenize is needed")
    exact_in = certification.get("exact_in")
    if exact_in is None:  # a certificate from before modes were named: certified meant exact in both
        exact_in = ["full_history", "incremental"] if certification.get("status") == "certified" else []
    if prompt_mode in exact_in:
        return None
    failed = [f for f in certification.get("failed") or [] if prompt_mode in (f.get("modes") or [prompt_mode])]
    parts = [f"{f['property']}: {f['detail']} -- {_ADVICE.get(f['property'], 'see docs/templates.md')}" for f in failed]
    parts += [f"{u['property']}: {u['detail']}" for u in certification.get("unchecked") or []]
    where = f" (exact in {' and '.join(m.replace('_', ' ') + ' mode' for m in exact_in)} only)" if exact_in else ""
    return (f"require_exact_template: the served template is not exact in {prompt_mode.replace('_', ' ')} "
            f"mode{where}: " + "; ".join(parts or ["no property says so"]))


@router.post("/engine/reprobe")
async def engine_reprobe(request: Request) -> Response:
    """Probe the engine's template again now (after a restart or a template change)."""
    ctx = _ctx(request)
    await ctx.engine_watch.ensure_fresh(ctx.upstream_for(None), force="asked by an operator")
    return _json(ctx.engine_info)
@router.post("/viewer/codes", status_code=201)
async def new_viewer_code(request: Request) -> Response:
    """A one-time code for the trace viewer: ``/viewer/login?code=...`` logs a browser in once, within
    ``code_s``, without the admin token ever being in a URL (``auth.ViewerLogins``). Needs the token
    itself: a viewer login's cookie only reads."""
    ctx = _ctx(request)
    code = ctx.viewer_logins.new_code()
    return _json({"code": code, "login_path": f"/viewer/login?code={code}",
                  "expires_in_s": ctx.viewer_logins.code_s}, status=201)


@router.post("/sessions", status_code=201)
async def create_session(spec: SessionSpec, request: Request) -> Response:
    ctx = _ctx(request)
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
    session.template_fingerprint = info.get("template_fingerprint")
    session.template_status = info.get("template_status") or "unverified"
    session.template_certification = info.get("template_certification") or (
        {"status": "uncertified", "reason": "not the default engine: its template is the trainer's own"}
        if not default else {"status": "uncertified", "reason": "template probing is off"})
    refusal = exact_template_refusal(session.template_certification, spec.prompt_mode)
    if refusal and spec.require_exact_template:
        raise HTTPException(status_code=409, detail=refusal)
    warnings: list[str] = []
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
    return _json(
        {
            "session_id": session.id,
            "secret": secret,
            "base_url": base_url_for(ctx, request, session.id),
            "affinity_key": session.affinity_key,
            "template_status": session.template_status,
            "template_fingerprint": session.template_fingerprint,
            "template_certification": session.template_certification,
            "warnings": warnings,
        },
        status=201,
    )


@router.get("/sessions")
async def list_sessions(request: Request) -> Response:
    return _json([s.summary() for s in _ctx(request).sessions.all()])


@router.get("/sessions/{session_id}")
async def get_session(session_id: str, request: Request) -> Response:
    return _json(_session_or_404(_ctx(request), session_id).summary())


@router.post("/sessions/{session_id}/close")
async def close_session(session_id: str, request: Request,
                        grace_s: float | None = Query(None, ge=0, le=3600)) -> Response:
    """Close a session: calls in flight get up to ``grace_s`` (default ``close_grace_s``) to finish,
    the rest are cancelled and recorded as such; when this answers, the session's records are final."""
    ctx = _ctx(request)
    session = _session_or_404(ctx, session_id)
    await ctx.sessions.close(session, reason="closed",
                             grace_s=ctx.config.close_grace_s if grace_s is None else grace_s)
    return _json(session.summary())


@router.post("/sessions/{session_id}/outcome")
async def set_outcome(session_id: str, body: OutcomeBody, request: Request) -> Response:
    """Record how the rollout ended (its reward, or why it has none), durably, beside its records:
    exports then carry the reward with every row. Allowed after close (a closed session refuses
    records, not its own row); a second outcome replaces the first."""
    if body.reward is None and not body.unscored_reason:
        raise HTTPException(422, "an outcome without a reward must say why (unscored_reason)")
    ctx = _ctx(request)
    session = _session_or_404(ctx, session_id)
    session.outcome = {"reward": body.reward, "unscored_reason": None if body.reward is not None else body.unscored_reason}
    await ctx.store.put_session(session.to_row())
    return _json(session.summary())


@router.get("/sessions/{session_id}/records")
async def session_records(
    session_id: str,
    request: Request,
    after_seq: int = Query(0, ge=0),
    format: str = Query("json", pattern="^(json|jsonl)$"),
    include: str = Query("all", pattern="^(all|tokens|training)$"),
) -> Response:
    ctx = _ctx(request)
    _session_or_404(ctx, session_id)
    return await records_response(ctx.store, session_id, after_seq=after_seq, include=include,
                                  jsonl=format == "jsonl")


@router.get("/sessions/{session_id}/training_trace")
async def training_trace(session_id: str, request: Request,
                         non_policy: str = Query("mask", pattern="^(mask|keep)$")) -> Response:
    """OpenEnv's ``TrainingTrace`` of the session's agent calls; ids sampled under a decoding constraint
    (logprobs not the policy's) are mask 0 unless ``non_policy=keep``."""
    ctx = _ctx(request)
    _session_or_404(ctx, session_id)
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
    ctx = _ctx(request)
    session = _session_or_404(ctx, session_id)
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
            return _json({**session.summary(), "timed_out": True})
        try:
            await asyncio.wait_for(session.changed.wait(), timeout=remaining)
        except asyncio.TimeoutError:
            pass
    return _json({**session.summary(), "timed_out": False})


# -- the weight-sync fence (D12) ---------------------------------------------------------------


async def _engine_call(ctx: RecorderContext, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
    upstream = ctx.upstream_for(None)
    if upstream is None:
        raise HTTPException(status_code=503, detail="no engine configured")
    try:
        reply = await upstream.request("POST", path, params=params)
    except UpstreamFailure as exc:
        raise HTTPException(status_code=502, detail=f"engine {path} failed: {exc.message}") from None
    if reply.status != 200:
        raise HTTPException(status_code=502, detail=f"engine {path} answered HTTP {reply.status}: {reply.body[:300]!r}")
    return reply.json or {}


async def _fence_engines(ctx: RecorderContext, step: str, mode: str | None = None) -> dict[str, Any]:
    """Pause or resume the engine: every replica when there are several (``replicas.py``; a router
    sends ``/pause`` to one of them), else the one engine."""
    if ctx.replicas is None:
        return await _engine_call(ctx, f"/{step}", {"mode": mode} if mode else None)
    try:
        return await (ctx.replicas.pause(mode or "keep") if step == "pause" else ctx.replicas.resume())
    except ReplicaFenceError as exc:
        raise HTTPException(status_code=502, detail=str(exc)) from None


@router.post("/engine/pause")
async def engine_pause(request: Request, mode: str = Query("keep", pattern="^(keep|wait|abort)$")) -> Response:
    """Close the fence, then pause the engine (vLLM dev mode ``POST /pause?mode=``)."""
    ctx = _ctx(request)
    ctx.fence.pause(mode)
    ctx.metrics.paused.set(1)
    try:
        engine = await _fence_engines(ctx, "pause", mode)
    except HTTPException:
        ctx.fence.resume(bump=False)
        ctx.metrics.paused.set(0)
        raise
    return _json({**ctx.fence.state(), "engine": engine})


@router.post("/engine/resume")
async def engine_resume(request: Request) -> Response:
    """Bump the policy version, resume the engine, open the fence -- in that order (``fence.py``):
    a kept call the engine finishes before acknowledging the resume must end at the new version.
    If the engine does not acknowledge, the fence stays closed and a retry does not bump again."""
    ctx = _ctx(request)
    ctx.fence.advance()
    ctx.metrics.policy_version.set(ctx.fence.version)
    engine = await _fence_engines(ctx, "resume")
    ctx.fence.resume(bump=True)
    ctx.metrics.paused.set(0)
    ctx.metrics.policy_version.set(ctx.fence.version)
    return _json({**ctx.fence.state(), "engine": engine})


@router.post("/fence/pause")
async def fence_pause(request: Request) -> Response:
    """For trainers that pause the engine themselves: hold new calls at the recorder."""
    ctx = _ctx(request)
    ctx.fence.pause("external")
    ctx.metrics.paused.set(1)
    return _json(ctx.fence.state())


@router.post("/fence/resume")
async def fence_resume(request: Request, bump: bool = Query(True)) -> Response:
    """Open the fence held by ``/fence/pause``. A trainer that resumes its engine itself and keeps
    calls across the sync should give the new version before resuming the engine
    (``POST /admin/policy_version`` while the fence is closed), then call this with ``bump=false``:
    a kept call can end between the engine's resume and this request."""
    ctx = _ctx(request)
    ctx.fence.resume(bump=bump)
    ctx.metrics.paused.set(0)
    ctx.metrics.policy_version.set(ctx.fence.version)
    return _json(ctx.fence.state())


@router.get("/fence")
async def fence_state(request: Request) -> Response:
    return _json(_ctx(request).fence.state())


@router.post("/policy_version")
async def set_policy_version(body: VersionBody, request: Request) -> Response:
    ctx = _ctx(request)
    ctx.fence.set_version(body.version)
    if body.model is not None:
        ctx.fence.served_model = body.model or None
    ctx.metrics.policy_version.set(body.version)
    return _json(ctx.fence.state())


metrics_router = APIRouter(dependencies=[Depends(require_admin)])


@metrics_router.get("/metrics")
async def metrics(request: Request) -> Response:
    ctx = _ctx(request)
    counts: dict[str, int] = {}
    for s in ctx.sessions.all():
        counts[s.status] = counts.get(s.status, 0) + 1
    for status in ("open", "stopped", "closed"):
        ctx.metrics.sessions.labels(status).set(counts.get(status, 0))
    cert = ctx.engine_info.get("template_certification")
    if cert:
        ctx.metrics.template_certified.set({"certified": 1, "failed": 0}.get(cert.get("status"), -1))
        for name, passed in (cert.get("properties") or {}).items():
            ctx.metrics.template_property.labels(name).set(-1 if passed is None else int(bool(passed)))
    store = ctx.store.stats()
    ctx.metrics.store_accepting.set(0 if ctx.store.failure() is not None else 1)
    ctx.metrics.store_unindexed.set(store.get("journal_unindexed", 0))
    ctx.metrics.store_backlog.set(store.get("journal_backlog", 0))
    return Response(ctx.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")
