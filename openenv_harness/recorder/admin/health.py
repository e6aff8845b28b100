"""Whether this recorder can do its job: health, where its admin listener is, the store's recovery,
and the Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from openenv_harness.recorder.admin.access import context_of, json_response, require_admin
from openenv_harness.recorder.context import RecorderContext

router = APIRouter()
#: ``/metrics`` sits at the root (where scrapers look), behind the same admin guard
metrics_router = APIRouter(dependencies=[Depends(require_admin)])


@router.get("/health")
async def health(request: Request) -> Response:
    """Everything a person or an orchestrator needs to tell whether calls can be recorded; 503 with
    ``status: store_unavailable`` (and the store's ``failure``) when they cannot."""
    ctx = context_of(request)
    by_status: dict[str, int] = {}
    for s in ctx.sessions.all():
        by_status[s.status] = by_status.get(s.status, 0) + 1
    store = ctx.store.stats()
    failed = ctx.store.failure() is not None
    return json_response({"status": "store_unavailable" if failed else "ok", "sessions": by_status,
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
    return json_response(admin_listener_info(context_of(request)))


@router.post("/store/recover")
async def store_recover(request: Request) -> Response:
    """Bring a failed store back without restarting the recorder (``RecordStore.recover``): the
    index process is replaced and every record it left unindexed is sent to it again."""
    ctx = context_of(request)
    recovered = await ctx.store.recover()
    failure = ctx.store.failure()
    return json_response({"recovered": recovered, "store": ctx.store.stats()}, status=503 if failure else 200)


@metrics_router.get("/metrics")
async def metrics(request: Request) -> Response:
    ctx = context_of(request)
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
