"""The weight-sync fence (D12) from the trainer's side: pause and resume the engine through the
recorder, hold calls at the recorder while the trainer pauses the engine itself, set the policy
version, and probe the engine's template again."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from openenv_harness.recorder.admin.access import context_of, json_response
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.replicas import ReplicaFenceError
from openenv_harness.recorder.upstream.base import UpstreamFailure

router = APIRouter()


class VersionBody(BaseModel):
    version: int = Field(ge=0)
    model: str | None = Field(None, description="Serve every call with this model name from now on (LoRA sync)")


@router.post("/engine/reprobe")
async def engine_reprobe(request: Request) -> Response:
    """Probe the engine's template again now (after a restart or a template change)."""
    ctx = context_of(request)
    await ctx.engine_watch.ensure_fresh(ctx.upstream_for(None), force="asked by an operator")
    return json_response(ctx.engine_info)


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
        acknowledged: dict[str, Any] = await (ctx.replicas.pause(mode or "keep") if step == "pause"
                                              else ctx.replicas.resume())
        return acknowledged
    except ReplicaFenceError as exc:
        raise HTTPException(status_code=502, detail=str(exc)) from None


@router.post("/engine/pause")
async def engine_pause(request: Request, mode: str = Query("keep", pattern="^(keep|wait|abort)$")) -> Response:
    """Close the fence, then pause the engine (vLLM dev mode ``POST /pause?mode=``)."""
    ctx = context_of(request)
    ctx.fence.pause(mode)
    ctx.metrics.paused.set(1)
    try:
        engine = await _fence_engines(ctx, "pause", mode)
    except HTTPException:
        ctx.fence.resume(bump=False)
        ctx.metrics.paused.set(0)
        raise
    return json_response({**ctx.fence.state(), "engine": engine})


@router.post("/engine/resume")
async def engine_resume(request: Request, bump: bool = Query(True)) -> Response:
    """Bump the policy version, resume the engine, open the fence -- in that order (``fence.py``):
    a kept call the engine finishes before acknowledging the resume must end at the new version.
    If the engine does not acknowledge, the fence stays closed and a retry does not bump again.
    ``bump=false`` resumes at the version as it stands: a sync that failed and put the old weights
    back (``trainer/weight_sync.py``) serves the old policy again, under its own version."""
    ctx = context_of(request)
    if bump:
        ctx.fence.advance()
        ctx.metrics.policy_version.set(ctx.fence.version)
    engine = await _fence_engines(ctx, "resume")
    ctx.fence.resume(bump=bump)
    ctx.metrics.paused.set(0)
    ctx.metrics.policy_version.set(ctx.fence.version)
    return json_response({**ctx.fence.state(), "engine": engine})


@router.post("/fence/pause")
async def fence_pause(request: Request) -> Response:
    """For trainers that pause the engine themselves: hold new calls at the recorder."""
    ctx = context_of(request)
    ctx.fence.pause("external")
    ctx.metrics.paused.set(1)
    return json_response(ctx.fence.state())


@router.post("/fence/resume")
async def fence_resume(request: Request, bump: bool = Query(True)) -> Response:
    """Open the fence held by ``/fence/pause``. A trainer that resumes its engine itself and keeps
    calls across the sync should give the new version before resuming the engine
    (``POST /admin/policy_version`` while the fence is closed), then call this with ``bump=false``:
    a kept call can end between the engine's resume and this request."""
    ctx = context_of(request)
    ctx.fence.resume(bump=bump)
    ctx.metrics.paused.set(0)
    ctx.metrics.policy_version.set(ctx.fence.version)
    return json_response(ctx.fence.state())


@router.get("/fence")
async def fence_state(request: Request) -> Response:
    return json_response(context_of(request).fence.state())


@router.post("/policy_version")
async def set_policy_version(body: VersionBody, request: Request) -> Response:
    ctx = context_of(request)
    ctx.fence.set_version(body.version)
    if body.model is not None:
        ctx.fence.served_model = body.model or None
    ctx.metrics.policy_version.set(body.version)
    return json_response(ctx.fence.state())
