"""vLLM over HTTP via aiohttp: the default transport for a real engine URL.

Why a second HTTP client: on the recorder's hot path the upstream call is most of the CPU a call
costs, and aiohttp's C-accelerated HTTP parser and connection pool spend a fraction of what the
pure-Python httpx/httpcore/h11 stack does per request (measured in ``benchmarks/``). ``HTTPEngine``
(httpx) stays for injectable transports -- ``MockTransport`` and ``ASGITransport`` in tests and
in-process engines -- and both produce the same ``UpstreamReply``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import orjson

from openenv_harness.recorder.upstream.base import Upstream, UpstreamFailure, UpstreamReply
from openenv_harness.recorder.upstream.http import SESSION_HEADER, normalize_engine_url
from openenv_harness.recorder.upstream.reply_parse import parse_chat_reply, parse_json_object


class AiohttpEngine(Upstream):
    """An engine reached over HTTP with aiohttp. ``base_url`` is the server root (``/v1`` appended)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        api_key: str | None = None,
        max_connections: int = 512,
    ) -> None:
        self.base_url = normalize_engine_url(base_url)
        self.name = f"http:{self.base_url}"
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
        self._headers = {"content-type": "application/json"}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=60, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, headers=self._headers,
                json_serialize=lambda o: orjson.dumps(o).decode(), auto_decompress=True,
            )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def chat(self, body: dict[str, Any], *, session_id: str) -> UpstreamReply:
        return await self._send("POST", "/v1/chat/completions", data=orjson.dumps(body),
                                headers={SESSION_HEADER: session_id}, chat=True)

    async def request(
        self, method: str, path: str, *, json: Any = None, params: dict[str, str] | None = None
    ) -> UpstreamReply:
        data = orjson.dumps(json) if json is not None else None
        return await self._send(method, path, data=data, params=params)

    async def _send(self, method: str, path: str, *, data: bytes | None = None,
                    headers: dict[str, str] | None = None, params: dict[str, str] | None = None,
                    chat: bool = False) -> UpstreamReply:
        if self._session is None:
            raise RuntimeError("AiohttpEngine.start() was not awaited")
        started = time.perf_counter()
        try:
            async with self._session.request(method, self.base_url + path, data=data, headers=headers,
                                             params=params) as resp:
                raw = await resp.read()
                status = resp.status
                reply_headers = {k.lower(): v for k, v in resp.headers.items()}
        except asyncio.TimeoutError as exc:
            raise UpstreamFailure("timeout", "engine timed out") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamFailure("connect", f"engine unreachable: {type(exc).__name__}: {exc}") from exc
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        prompt_ids = None
        if chat and status == 200:
            parsed, prompt_ids = parse_chat_reply(raw)
        else:
            parsed = parse_json_object(raw)
        return UpstreamReply(status=status, json=parsed, prompt_ids=prompt_ids, body=raw, headers=reply_headers,
                             elapsed_ms=elapsed_ms)
