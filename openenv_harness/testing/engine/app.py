"""The reference engine as an ASGI app: vLLM's OpenAI-compatible routes plus test controls.

vLLM routes served: ``POST /v1/chat/completions``, ``GET /v1/models``, ``POST /tokenize``,
``POST /detokenize``, ``GET /version``, ``GET /health``, ``GET|POST /ping``, ``GET /openapi.json``
(the route list) and, in dev mode, ``POST /pause``, ``POST /resume``, ``GET /is_paused`` and the
weight routes of ``weights.py`` (``/collective_rpc`` reload_weights, ``/reset_prefix_cache``,
``/update_weight_version``, ``GET /weight_info``).

With ``EngineConfig.family == "sglang"`` the app serves SGLang 0.5.23's routes instead
(``sglang_routes.py``), with the same test controls.

Test controls (not part of vLLM) live under ``/_ref/``: register scripts and faults by key, read
back the requests the engine received (bodies and headers, so a test can check exactly what a
recorder forwarded), reset everything, and read the engine's tokenizer/template fingerprints.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.types import Receive, Scope, Send

from openenv_harness.testing.engine.chat import (
    TRANSPORT_SCOPE_KEY,
    chat_completions,
    error_response,
    validation_message,
)
from openenv_harness.testing.engine.config import EngineConfig
from openenv_harness.testing.engine.faults import Fault
from openenv_harness.testing.engine.fence import PAUSE_MODES, EnginePaused
from openenv_harness.testing.engine.messages import MessageError
from openenv_harness.testing.engine.policy import Script
from openenv_harness.testing.engine.scale_out import add_scale_out_routes
from openenv_harness.testing.engine.sglang_routes import add_sglang_routes
from openenv_harness.testing.engine.prompt import render_prompt
from openenv_harness.testing.engine.state import DEFAULT_KEY, EngineState
from openenv_harness.testing.engine.weights import add_weight_routes, fault_answer, take_route_fault
from openenv_harness.testing.engine.wire import dumps


class EngineApp(FastAPI):
    """FastAPI, plus access to the connection's transport so faults can really drop connections,
    plus lean POST routes.

    The outermost ``send`` an ASGI server hands over is bound to its per-request cycle object;
    uvicorn's (h11 and httptools alike) carries the asyncio transport. Elsewhere (in-process
    transports) there is none, and a drop fault becomes a 500 reply instead.

    Lean routes (``lean_routes``: path -> handler) are POSTs answered straight from here, without
    FastAPI's and Starlette's middleware, routing and endpoint machinery: the chat route and the
    scale-out routes an incremental call waits on three of in a row, where that machinery cost about
    as much as the handlers (``docs/benchmarks.md``). The same handlers are also FastAPI routes, which
    answer any other method (a 405, like vLLM) the same way. Where the engine serves itself
    (``EngineServer``, its own process) uvicorn's parser hands these requests to the handlers before
    any ASGI cycle exists (``protocol.py``); this entry answers them under any other server.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lean_routes: dict[str, Callable[[Request], Awaitable[Response]]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            transport = getattr(getattr(send, "__self__", None), "transport", None)
            if transport is not None:
                scope[TRANSPORT_SCOPE_KEY] = transport
            key = self.state.engine.config.api_key
            if key and scope["path"].startswith("/v1") and (b"authorization", f"Bearer {key}".encode()) not in scope["headers"]:
                await error_response(401, "Unauthorized")(scope, receive, send)  # what vLLM --api-key answers
                return
            handler = self.lean_routes.get(scope["path"]) if scope["method"] == "POST" else None
            if handler is not None:
                await _answer_lean(handler, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


async def _answer_lean(handler: Callable[[Request], Awaitable[Response]], scope: Scope, receive: Receive,
                       send: Send) -> None:
    """One lean route's request: the handler's response, or the 500 the app's exception handler gives;
    its head and body leave in one socket write where the server's request cycle allows it."""
    response = await lean_reply(handler, Request(scope, receive))
    cycle = getattr(send, "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None or not hasattr(transport, "write") or isinstance(response, StreamingResponse):
        await response(scope, receive, send)
        return
    held = _OneWrite(transport)
    cycle.transport = held  # type: ignore[union-attr]
    try:
        await response(scope, receive, send)
    finally:
        cycle.transport = transport  # type: ignore[union-attr]
        held.flush()


async def lean_reply(handler: Callable[[Request], Awaitable[Response]], request: Request) -> Response:
    """What a lean route answers: the handler's response, or the 500 the app's exception handler
    gives (shared by the ASGI entry and the raw protocol, ``protocol.py``)."""
    try:
        return await handler(request)
    except EnginePaused as exc:  # vLLM 0.33's RetryableRequestError
        return paused_response(exc)
    except Exception as exc:  # noqa: BLE001 -- as ``_internal_error``: the client gets vLLM's error shape
        return error_response(500, f"{type(exc).__name__}: {exc}")


def paused_response(exc: EnginePaused) -> Response:
    """vLLM 0.33's answer to a request refused by a paused engine: ``RetryableRequestError`` as a 503
    ``ServiceUnavailableError`` (``vllm/entrypoints/serve/exception_handling/error_response.py``)."""
    body = {"error": {"message": str(exc), "type": "ServiceUnavailableError", "param": None, "code": 503}}
    return Response(dumps(body), status_code=503, media_type="application/json")


class _OneWrite:
    """A transport that holds what uvicorn's request cycle writes (the status and headers, then the
    body: two writes, so two loopback sends, each waking the client) and sends it as one write."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        self._parts.append(bytes(data))

    def flush(self) -> None:
        if self._parts:
            data, self._parts = b"".join(self._parts), []
            if not self._transport.is_closing():  # a dropped connection (a fault) takes no more bytes
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, ...: the real transport's
        return getattr(self._transport, name)


class ScriptRegistration(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(DEFAULT_KEY, min_length=1)
    script: Script


class FaultRegistration(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(DEFAULT_KEY, min_length=1)
    fault: Fault


class TokenizeRequest(BaseModel):
    """vLLM's two ``/tokenize`` forms: ``{prompt}`` or ``{messages, tools?, ...}``."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    tokens: list[int] = Field(description="Ids; negative ones are a 400, ids outside the vocabulary are skipped")


def _json(payload: Any, status: int = 200) -> Response:
    return Response(dumps(payload), status_code=status, media_type="application/json")


async def _parse(request: Request, model: type[BaseModel]) -> BaseModel | Response:
    """Validate a JSON body; a 400 in vLLM's error shape when it does not fit."""
    try:
        return model.model_validate(orjson.loads(await request.body() or b"{}"))
    except orjson.JSONDecodeError as exc:
        return error_response(400, f"Invalid JSON body: {exc}")
    except ValidationError as exc:
        return error_response(400, validation_message(exc))


def create_engine_app(config: EngineConfig | None = None) -> FastAPI:
    """Build a reference engine app; each app has its own scripts, faults, log and fence."""
    config = config or EngineConfig()
    state = EngineState(config)
    for key, script in config.scripts.items():
        state.set_script(key, script)
    app = EngineApp(title="openenv-harness reference engine", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine = state

    @app.exception_handler(EnginePaused)
    async def _paused(request: Request, exc: EnginePaused) -> Response:
        return paused_response(exc)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> Response:
        return error_response(500, f"{type(exc).__name__}: {exc}")

    _add_schema_route(app)
    if config.family == "sglang":  # SGLang's routes only: vLLM's answer 404 there
        # the runtime is where a test sees which requests are decoding, without a timing guess
        app.state.sglang = add_sglang_routes(app, state)
        _add_control_routes(app, state)
        return app

    @app.post("/v1/chat/completions")
    async def _chat(request: Request) -> Response:
        return await chat_completions(state, request)

    app.lean_routes["/v1/chat/completions"] = _chat

    @app.get("/v1/models")
    async def _models() -> Response:
        name, created = config.served_model_name, int(time.time())
        permission = {
            "id": f"modelperm-{state.system_fingerprint[-8:]}", "object": "model_permission", "created": created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
            "organization": "*", "group": None, "is_blocking": False,
        }
        card = {"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": state.model_root,
                "parent": None, "max_model_len": config.max_model_len, "permission": [permission]}
        return _json({"object": "list", "data": [card]})

    @app.post("/tokenize")
    async def _tokenize(request: Request) -> Response:
        parsed = await _parse(request, TokenizeRequest)
        if isinstance(parsed, Response):
            return parsed
        assert isinstance(parsed, TokenizeRequest)
        if (parsed.prompt is None) == (parsed.messages is None):
            return error_response(400, "Give exactly one of 'prompt' or 'messages'")
        if parsed.messages is not None:
            try:
                ids = render_prompt(config, state.template, state.tokenizer, messages=parsed.messages,
                                    tools=parsed.tools, add_generation_prompt=parsed.add_generation_prompt,
                                    chat_template_kwargs=parsed.chat_template_kwargs, route="tokenize").ids
            except MessageError as exc:
                return error_response(400, str(exc), exc.param)
        else:
            ids = state.tokenizer.encode(parsed.prompt or "")
        strs = [state.tokenizer.vocab_string(i) for i in ids] if parsed.return_token_strs else None
        return _json({"count": len(ids), "max_model_len": config.max_model_len, "tokens": ids, "token_strs": strs})

    @app.post("/detokenize")
    async def _detokenize(request: Request) -> Response:
        parsed = await _parse(request, DetokenizeRequest)
        if isinstance(parsed, Response):
            return parsed
        assert isinstance(parsed, DetokenizeRequest)
        negative = [t for t in parsed.tokens if t < 0]
        if negative:
            return error_response(400, f"tokens: Input should be greater than or equal to 0 (got {negative[:5]})",
                                  "tokens")
        known = [t for t in parsed.tokens if t < state.tokenizer.vocab_size]  # vLLM skips the others
        return _json({"prompt": state.tokenizer.decode(known)})

    @app.get("/version")
    async def _version() -> Response:
        return _json({"version": config.version})

    @app.get("/health")
    async def _health() -> Response:
        return Response(status_code=200)

    @app.api_route("/ping", methods=["GET", "POST"])
    async def _ping() -> Response:
        return Response(status_code=200)

    if config.scale_out:
        add_scale_out_routes(app, state)
    if config.dev_mode:
        _add_fence_routes(app, state)
        add_weight_routes(app, state)

    _add_control_routes(app, state)
    return app


def _add_schema_route(app: FastAPI) -> None:
    @app.get("/openapi.json", include_in_schema=False)
    async def _openapi() -> Response:
        """vLLM and SGLang serve FastAPI's schema (defaults: title ``FastAPI``, version ``0.1.0``); clients read its
        route list to see which optional routes (dev mode, scale-out) this engine serves. The operations
        here name their method only: the test controls under ``/_ref/`` are left out."""
        paths: dict[str, dict[str, Any]] = {}
        for route in app.routes:
            if isinstance(route, APIRoute) and route.include_in_schema and not route.path.startswith("/_ref/"):
                for method in sorted(route.methods or ()):
                    paths.setdefault(route.path, {})[method.lower()] = {"operationId": f"{route.name}_{method.lower()}"}
        return _json({"openapi": "3.1.0", "info": {"title": "FastAPI", "version": "0.1.0"}, "paths": paths})


def _failed(step: str) -> dict[str, Any]:
    """vLLM's body when pausing or resuming raised (its own shape, not the error envelope)."""
    return {"error": f"Failed to {step} generation: injected failure"}


def _add_fence_routes(app: FastAPI, state: EngineState) -> None:
    @app.post("/pause")
    async def _pause(request: Request) -> Response:
        mode = request.query_params.get("mode", "abort")  # no mode means abort, as in vLLM
        if mode not in PAUSE_MODES:
            expected = ", ".join(repr(m) for m in PAUSE_MODES[:-1]) + f" or {PAUSE_MODES[-1]!r}"
            body = {"error": {"message": f"1 validation error: query.mode: Input should be {expected} "
                                         f"(got {mode!r})", "type": "Bad Request", "param": "query.mode",
                              "code": 400}}
            return _json(body, 400)
        answer = fault_answer(await take_route_fault(state, "/pause"), _failed("pause"))
        if answer is not None:
            return answer
        await state.fence.pause(mode)
        return _json({"status": "paused"})

    @app.post("/resume")
    async def _resume() -> Response:
        answer = fault_answer(await take_route_fault(state, "/resume"), _failed("resume"))
        if answer is not None:
            return answer  # still paused
        state.fence.resume()
        return _json({"status": "resumed"})

    @app.get("/is_paused")
    async def _is_paused() -> Response:
        return _json({"is_paused": state.fence.paused})


def _add_control_routes(app: FastAPI, state: EngineState) -> None:
    @app.post("/_ref/scripts")
    async def _set_script(request: Request) -> Response:
        parsed = await _parse(request, ScriptRegistration)
        if isinstance(parsed, Response):
            return parsed
        assert isinstance(parsed, ScriptRegistration)
        state.set_script(parsed.key, parsed.script)
        return _json({"ok": True, "key": parsed.key})

    @app.post("/_ref/faults")
    async def _add_fault(request: Request) -> Response:
        parsed = await _parse(request, FaultRegistration)
        if isinstance(parsed, Response):
            return parsed
        assert isinstance(parsed, FaultRegistration)
        state.add_fault(parsed.key, parsed.fault)
        return _json({"ok": True, "key": parsed.key, "pending": state.faults.pending(parsed.key)})

    @app.get("/_ref/requests")
    async def _requests(request: Request) -> Response:
        return _json({"requests": state.recorded(request.query_params.get("key"))})

    @app.post("/_ref/reset")
    async def _reset() -> Response:
        state.reset()
        return _json({"ok": True})

    @app.get("/_ref/info")
    async def _info() -> Response:
        tokenizer = state.tokenizer
        return _json({
            "served_model_name": state.config.served_model_name,
            "version": state.config.version,
            "chat_template": state.template.name,
            "template_sha256": state.template.sha256,
            "tokenizer": tokenizer.source,
            "system_fingerprint": state.system_fingerprint,
            "tokenizer_sha256": tokenizer.fingerprint(),
            "vocab_size": tokenizer.vocab_size,
            "eos_token_id": tokenizer.im_end_id,
            "in_flight": state.fence.in_flight,
            "paused": state.fence.paused,
            **state.weights.info(),
        })
