"""The engine routes a disk weight sync uses, one small piece per engine family.

Why a piece and not branches in ``DiskWeightSync``: the sync's order and its failure-state rules
(``weight_sync.py``) are the same on every engine; what differs is only how an engine is told to load
a folder, to drop its prefix cache, and to name and report its weights' version:

- **vLLM** (dev mode): ``POST /collective_rpc`` naming ``reload_weights``, ``POST /reset_prefix_cache``
  (answers 200 with ``success: false`` while blocks are held), ``POST /update_weight_version`` and
  ``GET /weight_info``.
- **SGLang**: ``POST /update_weights_from_disk`` (``success`` in its answer, 400 on failure),
  ``POST /flush_cache`` (400 while it cannot flush), ``POST /update_weight_version`` -- with
  ``abort_all_requests: false``, as its default aborts the calls a ``keep`` pause holds -- and
  ``GET /model_info``'s ``weight_version``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import httpx

#: ``send(method, path, body)``: the sync's HTTP call to the engine; raises on a transport error or a 4xx/5xx
Send = Callable[[str, str, "dict[str, Any] | None"], httpx.Response]


class EngineRouteError(RuntimeError):
    """The engine answered, but not that it did what it was asked."""


class WeightRoutes(Protocol):
    family: str
    #: what the sync report names as the load method
    method: str
    #: routes the sync cannot do without, and the ones it uses where served
    required: tuple[str, ...]
    optional: tuple[str, ...]
    #: how to get the required routes served
    hint: str
    #: the routes that set and read the weights' version name
    label_route: str
    read_route: str

    def load(self, send: Send, folder: Path, timeout_s: float) -> None: ...

    def reset_cache(self, send: Send) -> Any:
        """The engine's answer when it dropped its cache; raises ``EngineRouteError`` when it did not."""

    def set_label(self, send: Send, label: str) -> None: ...

    def read_label(self, send: Send) -> str: ...


class VLLMWeightRoutes:
    family = "vllm"
    method = "collective_rpc:reload_weights"
    required: tuple[str, ...] = ("/collective_rpc", "/reset_prefix_cache")
    optional: tuple[str, ...] = ("/update_weight_version", "/weight_info", "/pause", "/resume")
    hint = "start vLLM with VLLM_SERVER_DEV_MODE=1 (the project's launcher does)"
    label_route = "/update_weight_version"
    read_route = "/weight_info"

    def load(self, send: Send, folder: Path, timeout_s: float) -> None:
        send("POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(folder)},
                                         "timeout": timeout_s})

    def reset_cache(self, send: Send) -> Any:
        answer = _json(send("POST", "/reset_prefix_cache", None))
        if not (isinstance(answer, dict) and answer.get("success") is True):
            raise EngineRouteError(f"/reset_prefix_cache answered {answer!r}")
        return answer

    def set_label(self, send: Send, label: str) -> None:
        send("POST", "/update_weight_version", {"new_version": label})

    def read_label(self, send: Send) -> str:
        answer = _json(send("GET", "/weight_info", None))
        version = answer.get("weight_version") if isinstance(answer, dict) else None
        if not isinstance(version, str):
            raise EngineRouteError(f"/weight_info answered no weight version: {answer!r}")
        return version


class SGLangWeightRoutes:
    family = "sglang"
    method = "update_weights_from_disk"
    required: tuple[str, ...] = ("/update_weights_from_disk", "/flush_cache")
    optional: tuple[str, ...] = ("/update_weight_version", "/model_info", "/pause_generation", "/continue_generation")
    hint = "serve SGLang's HTTP server (python -m sglang.launch_server): it has these routes"
    label_route = "/update_weight_version"
    read_route = "/model_info"

    def load(self, send: Send, folder: Path, timeout_s: float) -> None:
        answer = _json(send("POST", "/update_weights_from_disk",
                            {"model_path": str(folder), "abort_all_requests": False, "flush_cache": True}))
        if not (isinstance(answer, dict) and answer.get("success") is True):
            raise EngineRouteError(f"/update_weights_from_disk answered {answer!r}")

    def reset_cache(self, send: Send) -> Any:
        resp = send("POST", "/flush_cache", None)
        return resp.text[:200]

    def set_label(self, send: Send, label: str) -> None:
        send("POST", "/update_weight_version", {"new_version": label, "abort_all_requests": False})

    def read_label(self, send: Send) -> str:
        answer = _json(send("GET", "/model_info", None))
        version = answer.get("weight_version") if isinstance(answer, dict) else None
        if not isinstance(version, str):
            raise EngineRouteError(f"/model_info answered no weight version: {answer!r}")
        return version


FAMILIES: dict[str, WeightRoutes] = {"vllm": VLLMWeightRoutes(), "sglang": SGLangWeightRoutes()}


def weight_routes(family: str) -> WeightRoutes:
    try:
        return FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown engine family {family!r}: {', '.join(FAMILIES)}") from None


def _json(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return resp.text[:200]
