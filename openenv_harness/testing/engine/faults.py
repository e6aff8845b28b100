"""Fault injection: the ways a real engine fails, on demand and counted.

Why counted faults keyed like scripts: a recorder test wants "the 2nd agent call of session S
gets a 429 once, then succeeds", without affecting other sessions running in parallel. A fault
is registered under a key (session header, model name, or ``*``), optionally pinned to one turn,
and hits ``count`` matching requests before it is used up.

HTTP error bodies follow vLLM: ``{"error": {"message", "type", "param", "code"}}`` from its
serving layer, ``type`` being the exception name it uses (``BadRequestError``, ``NotFoundError``,
``InternalServerError``) or, for statuses it only raises as ``HTTPException``, the HTTP reason
phrase. A 401 is what vLLM's ``--api-key`` middleware answers: ``{"error": "Unauthorized"}``.

A fault can also target one of vLLM's dev-mode routes a weight sync uses (``DEV_ROUTES``: reload
through ``/collective_rpc``, ``/reset_prefix_cache``, the weight-version routes, ``/pause`` and
``/resume``): there it answers an error status (the route's effect fails), waits first
(``latency_s``: a reload slower than its client's timeout), or answers 200 with another body
(``reply``: ``{"success": false}`` from a prefix-cache reset that did not happen).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: vLLM's dev-mode routes a fault can target besides the sampling and render routes (``weights.py``)
DEV_ROUTES: tuple[str, ...] = ("/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/weight_info",
                               "/pause", "/resume",
                               # SGLang's (the flavour's ``sglang_routes.py``)
                               "/update_weights_from_disk", "/flush_cache", "/pause_generation",
                               "/continue_generation", "/model_info")

_ERROR_TYPES: dict[int, str] = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The JSON body vLLM sends with an error status."""
    if status == 401:
        return {"error": "Unauthorized"}
    kind = _ERROR_TYPES.get(status) or HTTPStatus(status).phrase
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


class Fault(BaseModel):
    """One injected failure. Effects combine: e.g. ``latency_s`` then ``status``."""

    model_config = ConfigDict(extra="forbid")

    status: int | None = Field(None, ge=400, le=599, description="Answer with this HTTP error")
    message: str | None = Field(None, description="Error message (a default per status otherwise)")
    retry_after: float | None = Field(None, ge=0, description="Retry-After header, seconds (429 default 1)")
    body: dict[str, Any] | None = Field(None, description="Replace the error body entirely")
    latency_s: float = Field(0.0, ge=0, description="Wait this long before answering")
    drop: bool = Field(False, description="Close the connection: before headers, or mid-stream")
    missing_token_ids: bool = Field(False, description="Omit prompt_token_ids and token_ids")
    logprob_mismatch: bool = Field(False, description="Return one logprob fewer than token ids")
    usage_mismatch: bool = Field(False, description="usage.completion_tokens off by one")
    nan_logprob: bool = Field(False, description="One logprob is NaN")
    count: int = Field(1, ge=1, description="How many matching requests it hits")
    on_turn: int | None = Field(None, ge=0, description="Only the request serving this turn index")
    agent_only: bool = Field(False, description="Never hit calls without tools (titles, summaries)")
    echo_headers: bool = Field(False, description="With status: the error message quotes the request's headers, "
                               "credentials included, as some gateways do")
    route: str | None = Field(None, description="Only requests to this path (/v1/chat/completions/render or one "
                              "of DEV_ROUTES); None: any sampling route (chat, generate, completions)")
    reply: dict[str, Any] | None = Field(None, description="On a dev route: answer 200 with this body and do "
                                         "nothing (a /reset_prefix_cache that reports it did not reset)")

    @model_validator(mode="after")
    def _has_an_effect(self) -> Fault:
        dev_route = self.route in DEV_ROUTES
        if self.reply is not None and (not dev_route or self.status is not None):
            raise ValueError(f"a reply body replaces the answer of a dev route ({', '.join(DEV_ROUTES)}), "
                             "without an error status")
        waits_or_replies = self.latency_s > 0 or self.reply is not None
        if self.route is not None and self.status is None and not (dev_route and waits_or_replies):
            raise ValueError("a fault on a non-sampling route (route) answers an error status (a dev route may "
                             "instead wait, latency_s, or answer a reply body)")
        effects = (
            self.status is not None,
            self.latency_s > 0,
            self.drop,
            self.missing_token_ids,
            self.logprob_mismatch,
            self.usage_mismatch,
            self.nan_logprob,
            self.reply is not None,
        )
        if not any(effects):
            raise ValueError("a fault needs at least one effect (status, latency_s, drop, or a reply defect)")
        return self

    def error_response_body(self, headers: dict[str, str] | None = None) -> dict[str, Any]:
        assert self.status is not None
        if self.body is not None:
            return self.body
        message = self.message or f"Injected {self.status} {HTTPStatus(self.status).phrase}"
        if self.echo_headers:
            message += f" (request headers: {headers or {}})"
        return error_body(self.status, message)

    def error_headers(self) -> dict[str, str]:
        retry_after = self.retry_after
        if retry_after is None and self.status == 429:
            retry_after = 1
        if retry_after is None:
            return {}
        return {"Retry-After": f"{retry_after:g}"}


@dataclass
class _Entry:
    fault: Fault
    remaining: int


class FaultBook:
    """Registered faults by key; thread-safe, because tests register them from another thread."""

    def __init__(self) -> None:
        self._entries: dict[str, list[_Entry]] = {}
        self._lock = threading.Lock()

    def add(self, key: str, fault: Fault) -> None:
        with self._lock:
            self._entries.setdefault(key, []).append(_Entry(fault, fault.count))

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def pending(self, key: str) -> int:
        """How many hits the faults under ``key`` still have."""
        with self._lock:
            return sum(entry.remaining for entry in self._entries.get(key, []))

    def targets(self, route: str) -> bool:
        """Whether any fault with hits left is registered for ``route`` (lets that route skip the
        work of matching one when there is none: the render route would read the turn every time)."""
        with self._lock:
            return any(e.fault.route == route and e.remaining > 0 for entries in self._entries.values() for e in entries)

    def take(self, keys: list[str], turn_index: int, is_aux: bool, route: str | None = None) -> Fault | None:
        """Consume one hit of the first fault matching this request, looking up ``keys`` in order.

        ``route`` is the path of a non-sampling route (render); sampling routes pass None."""
        with self._lock:
            for key in keys:
                for entry in self._entries.get(key, []):
                    fault = entry.fault
                    if entry.remaining <= 0:
                        continue
                    if fault.agent_only and is_aux:
                        continue
                    if fault.route != route:
                        continue
                    if fault.on_turn is not None and (is_aux or fault.on_turn != turn_index):
                        continue
                    entry.remaining -= 1
                    return fault
        return None
