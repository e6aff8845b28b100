"""Errors the agent receives, in the OpenAI error shape its SDK understands.

Why the care: agent SDKs decide whether to retry from the status alone (429/5xx retry, other 4xx
fail fast), so the status is policy, and the message is what a person reads in
the agent's stderr when a rollout fails.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


class AgentError(Exception):
    """Raised anywhere in a flow to answer the agent with an error instead of a completion."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
        upstream_body: Any = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.headers = headers or {}
        self.upstream_body = upstream_body
        #: set by the forward step on a call the engine was asked and failed: the call is recorded
        #: as failed before the agent hears of it (``call/pipeline.py``)
        self.engine_failure = False

    def to_response(self) -> Response:
        return error_response(self.status, self.message, type=self.type, code=self.code, headers=self.headers)


def error_body(message: str, *, type: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": None, "code": code}}


def error_response(
    status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    return Response(
        orjson.dumps(error_body(message, type=type, code=code)),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def body_too_large(limit: int) -> AgentError:
    """A request body over ``RecorderConfig.max_body_bytes`` (every route that reads one says the same)."""
    return AgentError(413, f"request body exceeds {limit} bytes", code="body_too_large")


def session_closed(session_id: str, *, in_flight: bool = False) -> AgentError:
    message = (f"session {session_id} was closed while this call was in flight; it was not answered" if in_flight
               else f"session {session_id} is closed")
    return AgentError(409, message, type="invalid_request_error", code="session_closed")
