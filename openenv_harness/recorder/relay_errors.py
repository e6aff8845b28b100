"""Map engine failures to statuses agent SDKs handle (D14), keeping the original error.

429 and 5xx stay retryable (with the engine's Retry-After passed through); other 4xx fail fast with
the engine's own message; no answer at all becomes 502 (connect) or 504 (timeout). The agent only
ever sees an HTTP error -- never a broken stream -- because the recorder calls the engine without
streaming and answers only once the outcome is known.
"""

from __future__ import annotations

from typing import Any

from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.upstream.base import UpstreamFailure, UpstreamReply


def _engine_message(reply: UpstreamReply) -> tuple[str, Any]:
    body: Any = reply.json
    if body is None:
        text = reply.body[:2000].decode("utf-8", "replace")
        return (text or f"HTTP {reply.status}"), text
    err = body.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return err["message"], body
    if isinstance(err, str):
        return err, body
    if isinstance(body.get("message"), str):
        return body["message"], body
    if isinstance(body.get("detail"), str):
        return body["detail"], body
    return f"HTTP {reply.status}", body


def relay_upstream_error(reply: UpstreamReply) -> AgentError:
    message, original = _engine_message(reply)
    status = reply.status
    headers: dict[str, str] = {}
    retry_after = reply.headers.get("retry-after")
    if retry_after:
        headers["retry-after"] = retry_after
    if status == 200:
        return AgentError(502, "engine returned a reply that is not a JSON object", type="server_error",
                          code="engine_bad_reply", upstream_body=original)
    if status == 429:
        return AgentError(429, f"engine: {message}", type="rate_limit_error", code="engine_429",
                          headers=headers, upstream_body=original)
    if status >= 500:
        return AgentError(status if status in (500, 502, 503, 504) else 502, f"engine: {message}",
                          type="server_error", code=f"engine_{status}", headers=headers, upstream_body=original)
    if 400 <= status < 500:
        return AgentError(status, f"engine: {message}", type="invalid_request_error", code=f"engine_{status}",
                          upstream_body=original)
    return AgentError(502, f"engine answered HTTP {status}", type="server_error", code=f"engine_{status}",
                      upstream_body=original)


def relay_upstream_failure(exc: UpstreamFailure, retry_after_s: int) -> AgentError:
    status = 504 if exc.kind == "timeout" else 502
    return AgentError(status, exc.message, type="server_error", code=f"engine_{exc.kind}",
                      headers={"retry-after": str(retry_after_s)})
