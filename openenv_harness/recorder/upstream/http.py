"""vLLM (or any OpenAI-compatible engine that returns token ids) over HTTP, via httpx.

The transport is injectable, httpx-style: tests and benchmarks can pass ``httpx.ASGITransport`` or a
``MockTransport``; production uses pooled keep-alive connections to the trainer's engine.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson

from openenv_harness.recorder.upstream.base import (
    Upstream,
    UpstreamFailure,
    UpstreamReply,
    check_engine_url,
    redact_key,
)
from openenv_harness.recorder.upstream.reply_parse import parse_engine_reply

#: Header carrying the recorder's session id upstream: sticky routing for engines and routers that
#: honour it, script selection for the reference engine; ignored by vLLM.
SESSION_HEADER = "X-OpenEnv-Harness-Session"
#: Header carrying the session's trajectory affinity key: the first key vllm-router's
#: ``consistent_hash`` policy reads (then other id headers, then the body), so all calls of one
#: trajectory reach one replica and its prefix cache. Opaque and fresh per session (siblings and
#: retried rollouts are sessions of their own, so they get keys of their own).
AFFINITY_HEADER = "X-Session-ID"


def normalize_engine_url(url: str) -> str:
    """Accept ``http://host:8000`` or ``http://host:8000/v1``; return the server root."""
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


class HTTPEngine(Upstream):
    """An engine reached over HTTP. ``base_url`` is the server root (``/v1`` is appended)."""

    def __init__(
        self,
        base_url: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        api_key: str | None = None,
        max_connections: int = 512,
        affinity_header: str | None = AFFINITY_HEADER,
    ) -> None:
        check_engine_url(base_url)
        self.base_url = normalize_engine_url(base_url)
        self.name = self.base_url  # what the records name as the engine: its URL (a white-box step names itself)
        self._api_key = api_key
        self._affinity_header = affinity_header
        self._transport = transport
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._headers = {"content-type": "application/json"}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.base_url,
                transport=self._transport,
                timeout=self._timeout,
                limits=self._limits,
                headers=self._headers,
            )

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _require_client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("HTTPEngine.start() was not awaited")
        return self._client

    async def chat(self, body: dict[str, Any], *, session_id: str, affinity: str | None = None) -> UpstreamReply:
        return await self._send("POST", "/v1/chat/completions", content=orjson.dumps(body),
                                headers=self._session_headers(session_id, affinity), chat=True)

    exact_ids = True

    async def post_for_session(self, path: str, body: dict[str, Any], *, session_id: str,
                               affinity: str | None = None) -> UpstreamReply:
        return await self._send("POST", path, content=orjson.dumps(body),
                                headers=self._session_headers(session_id, affinity))

    def _session_headers(self, session_id: str, affinity: str | None) -> dict[str, str]:
        headers = {SESSION_HEADER: session_id}
        if affinity and self._affinity_header:
            headers[self._affinity_header] = affinity
        return headers

    async def request(
        self, method: str, path: str, *, json: Any = None, params: dict[str, str] | None = None
    ) -> UpstreamReply:
        content = orjson.dumps(json) if json is not None else None
        return await self._send(method, path, content=content, params=params)

    async def _send(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
        chat: bool = False,
    ) -> UpstreamReply:
        client = self._require_client()
        started = time.perf_counter()
        try:
            resp = await client.request(method, path, content=content, headers=headers, params=params)
        except httpx.TimeoutException as exc:
            raise UpstreamFailure("timeout", f"engine timed out: {type(exc).__name__}") from exc
        except httpx.TransportError as exc:
            raise UpstreamFailure("connect", f"engine unreachable: {type(exc).__name__}: {exc}") from exc
        elapsed = (time.perf_counter() - started) * 1000.0
        raw = resp.content if resp.status_code == 200 else redact_key(resp.content, self._api_key)
        parsed, span, doubts = parse_engine_reply(raw, status=resp.status_code, chat=chat)
        return UpstreamReply(
            status=resp.status_code,
            json=parsed,
            prompt_span=span,
            doubts=doubts,
            body=raw,
            headers={k.lower(): v for k, v in resp.headers.items()},
            elapsed_ms=elapsed,
        )
