"""The recorder's ASGI app: agent routes, admin routes, the trace viewer, liveness.

Agent routes are plain Starlette routes (no FastAPI body parsing or validation in the hot path:
the flow reads raw bytes with orjson); the control plane uses FastAPI for typed bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import Response

from openenv_harness.recorder import admin
from openenv_harness.recorder.auth import AdminAuth, new_admin_token
from openenv_harness.recorder.call.admit import authenticate
from openenv_harness.recorder.call.pipeline import handle_call
from openenv_harness.recorder.context import RecorderConfig, RecorderContext
from openenv_harness.recorder.dialects.anthropic import ANTHROPIC
from openenv_harness.recorder.dialects.base import Dialect
from openenv_harness.recorder.dialects.chat import CHAT
from openenv_harness.recorder.dialects.gemini import COUNT, google_error, parse_target
from openenv_harness.recorder.dialects.routes import agent_target
from openenv_harness.recorder.edge.count_tokens import anthropic_count_tokens_route, gemini_count_tokens_route
from openenv_harness.recorder.edge.error_handlers import install_error_handlers
from openenv_harness.recorder.edge.request_body import ClientGone, receive_body
from openenv_harness.recorder.edge.request_limits import RequestLimits, check_scope
from openenv_harness.recorder.engine_knowledge.engine_watch import EngineWatch
from openenv_harness.recorder.errors import AgentError, error_response
from openenv_harness.recorder.fence import Fence
from openenv_harness.recorder.metrics import RecorderMetrics
from openenv_harness.recorder.replicas import ReplicaFence
from openenv_harness.recorder.session.registry import SessionRegistry
from openenv_harness.recorder.store.base import RecordStore
from openenv_harness.recorder.store.sqlite import SQLiteStore
from openenv_harness.recorder.upstream.base import Upstream, UpstreamFailure
from openenv_harness.recorder.upstream.h1_engine import H1Engine
from openenv_harness.recorder.upstream.sglang import engine_for
from openenv_harness.recorder.upstream.span_budget import SpanBudget
from openenv_harness.viewer import viewer_router

log = logging.getLogger(__name__)


def _agent_headers(request: Request) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.scope["headers"]}


async def google_models_route(request: Request) -> Response:
    """Google's model-method paths (``.../models/<model>:<method>``) that are not generation:
    ``countTokens`` from the engine's tokenizer, anything else a 404 in Google's shape. Generation
    never reaches a route: ``RecorderApp`` takes every agent call before routing."""
    target = parse_target(request.url.path)
    if target is None or target.method != COUNT:
        return google_error(404, f"no such method: {request.url.path}")
    return await gemini_count_tokens_route(request, target)


async def models_route(request: Request) -> Response:
    """``GET /v1/models`` for agents that list models: authenticated, answered from the engine.

    A client that sends ``anthropic-version`` (Claude Code with gateway model discovery on) gets
    the list in Anthropic's shape, and its errors in Anthropic's error shape.
    """
    ctx: RecorderContext = request.app.state.ctx
    headers = _agent_headers(request)
    dialect: Dialect = ANTHROPIC if "anthropic-version" in headers else CHAT
    try:
        session = authenticate(ctx.sessions, request.path_params.get("session_id"), headers)
        upstream = ctx.upstream_for(session.spec.upstream)
        if upstream is None:
            raise AgentError(503, "no engine configured", type="server_error")
        try:
            reply = await upstream.request("GET", "/v1/models")
        except UpstreamFailure as exc:
            raise AgentError(502, exc.message, type="server_error") from None
    except AgentError as exc:
        return dialect.error(exc)
    return dialect.models(reply)


_UNAVAILABLE = b'{"status":"unavailable","reason":"the record store cannot accept records"}'


async def healthz(request: Request) -> Response:
    """Liveness, unauthenticated: says nothing about sessions, engines or configuration -- only
    whether this recorder can do its job. A recorder whose store cannot take records answers every
    call with 503, so it is not alive for anyone relying on it: 503 here too (restarting it is one
    way back -- the journal is indexed at open; ``POST /admin/store/recover`` is another, in place).
    Why it failed is for the admin-guarded ``/admin/health``."""
    ctx: RecorderContext = request.app.state.ctx
    if ctx.store.failure() is not None:
        return Response(_UNAVAILABLE, status_code=503, media_type="application/json")
    return Response(b'{"status":"ok"}', media_type="application/json")


async def readyz(request: Request) -> Response:
    """Readiness, unauthenticated: whether a call sent now can be recorded (the store takes records)."""
    ctx: RecorderContext = request.app.state.ctx
    if ctx.store.failure() is not None:
        return Response(_UNAVAILABLE, status_code=503, media_type="application/json")
    return Response(b'{"status":"ready"}', media_type="application/json")


class RecorderApp:
    """The recorder as an ASGI app: agent chat calls take a raw-ASGI fast path; everything else
    (admin API, viewer, models, lifespan) is the FastAPI app behind it.

    Why: the chat route is the only hot path, and Starlette's routing and middleware stack cost more
    per call than the rest of the recorder's own work. ``state`` is the inner app's state. Under
    the recorder's own server, chat calls skip ASGI altogether (``edge/agent_protocol.py``); this path
    serves them under any other ASGI server, and the requests that protocol leaves to uvicorn.
    """

    def __init__(self, inner: FastAPI) -> None:
        self.inner = inner
        self.state = inner.state
        #: the recorder behind this app: what the agent-call protocol serves agent calls with (``edge/agent_protocol.py``)
        self.recorder_context: RecorderContext = inner.state.ctx
        self.limits = RequestLimits.of(inner.state.ctx.config)

    def connection_settings(self) -> dict[str, Any]:
        """How the server holding this app keeps connections (``serving.connection_settings``)."""
        config = self.recorder_context.config
        return {"timeout_keep_alive": config.keep_alive_timeout_s, "backlog": config.listen_backlog,
                "h11_max_incomplete_event_size": config.max_header_bytes}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":  # the recorder's own protocol has checked this already; another server may not
            refusal = check_scope(scope, self.limits)
            if refusal is not None:
                await refusal.to_response()(scope, receive, send)
                return
        target = agent_target(scope["path"]) if scope["type"] == "http" else None
        if target is not None:
            # every agent call is answered here, before routing: the routed app has no agent routes
            if scope["method"] == "POST":
                response = await self._chat(scope, receive, *target)
            else:
                response = error_response(405, f"method {scope['method']} not allowed on {scope['path']}",
                                          code="method_not_allowed")
            await response(scope, receive, send)
            return
        await self.inner(scope, receive, send)

    async def _chat(self, scope: dict[str, Any], receive: Any, session_id: str | None, dialect: Dialect) -> Response:
        ctx: RecorderContext = self.state.ctx
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            raw = await receive_body(receive, headers.get("content-length"), ctx.config.max_body_bytes)
        except ClientGone:
            return Response(status_code=499)
        except AgentError as refused:  # too large: in the agent's own API's error shape
            return dialect.error(refused)
        return await handle_call(ctx, session_id, headers, raw, dialect)


def create_recorder_app(
    config: RecorderConfig,
    *,
    upstreams: dict[str, Upstream] | None = None,
    store: RecordStore | None = None,
) -> RecorderApp:
    """Build a recorder. ``upstreams["default"]`` defaults to ``H1Engine(config.engine_url)``."""
    ups: dict[str, Upstream] = dict(upstreams or {})
    if "default" not in ups and config.engine_url:
        transport = H1Engine(
            config.engine_url, timeout_s=config.upstream_timeout_s, api_key=config.engine_api_key,
            affinity_header=config.affinity_header,
        )
        ups["default"] = engine_for(config.engine_family, transport)
    admin_token = config.admin_token or new_admin_token()
    the_store = store or SQLiteStore(config.store_path, synchronous=config.sqlite_synchronous,
                                     indexer=config.store_indexer, index_priority=config.index_priority,
                                     max_backlog_bytes=int(config.store_backlog_mb * (1 << 20)))
    span_budget = SpanBudget(int(config.prompt_cache_mb * (1 << 20)))
    ctx = RecorderContext(
        config=config,
        store=the_store,
        sessions=SessionRegistry(the_store, span_budget),
        fence=Fence(wait_s=config.pause_wait_s),
        upstreams=ups,
        metrics=RecorderMetrics(),
        admin_token=admin_token,
        admin_auth=AdminAuth(admin_token),
        engine_watch=EngineWatch({}, ttl_s=config.template_reprobe_s, probe_template=config.probe_template,
                                 probe_logprobs_mode=config.probe_logprobs_mode),
        span_budget=span_budget,
    )
    if config.engine_replicas or config.engine_replicas_from_router:
        ctx.replicas = ReplicaFence(config.engine_replicas, api_key=config.engine_api_key, family=config.engine_family,
                                    router=ups.get("default") if config.engine_replicas_from_router else None)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx.sessions.loop = asyncio.get_running_loop()  # the chat loop
        ctx.store.open()
        loaded = ctx.sessions.load()
        if loaded:
            log.info("recorder: resumed %d session(s) from %s", loaded, config.store_path)
        for upstream in ctx.upstreams.values():
            await upstream.start()
        await ctx.engine_watch.ensure_fresh(ctx.upstream_for(None))
        if config.admin_port is not None:
            if ctx.start_admin_listener is None:
                raise RuntimeError("admin_port needs the recorder's own server (server.serve or RecorderServer): it "
                                   "binds the admin listener next to the main port")
            ctx.admin_listener = await asyncio.to_thread(ctx.start_admin_listener)
        try:
            yield
        finally:
            if ctx.admin_listener is not None:  # before the store closes: it may be writing a session
                await asyncio.to_thread(ctx.admin_listener.stop)
                ctx.admin_listener = None
            for upstream in ctx.upstreams.values():
                await upstream.aclose()
            if ctx.replicas is not None:
                await ctx.replicas.aclose()
            ctx.store.close()

    app = FastAPI(title="openenv-harness recorder", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.ctx = ctx
    app.add_route("/healthz", healthz, methods=["GET"])
    app.add_route("/readyz", readyz, methods=["GET"])
    app.add_route("/rollout/{session_id}/{version}/models/{target:path}", google_models_route, methods=["POST"])
    app.add_route("/{version}/models/{target:path}", google_models_route, methods=["POST"])
    app.add_route("/rollout/{session_id}/v1/messages/count_tokens", anthropic_count_tokens_route, methods=["POST"])
    app.add_route("/v1/messages/count_tokens", anthropic_count_tokens_route, methods=["POST"])
    app.add_route("/rollout/{session_id}/v1/models", models_route, methods=["GET"])
    app.add_route("/v1/models", models_route, methods=["GET"])
    app.include_router(admin.router)
    app.include_router(admin.metrics_router)
    app.include_router(viewer_router)

    install_error_handlers(app, config)

    return RecorderApp(app)
