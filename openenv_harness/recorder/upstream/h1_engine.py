"""vLLM over HTTP/1.1 with a small keep-alive client on httptools: the default engine transport.

Why not a general HTTP client: the engine hop is the recorder's hottest path, and with aiohttp
its client was the largest single share of the recorder's CPU per call in the profiles
(``docs/benchmarks.md``: ~20 %, more than uvicorn serving the agent). This hop needs little: one
engine origin, JSON bodies with a known length, keep-alive, a connection cap, timeouts, errors
classified for the agent. The HTTP parsing itself -- status line, headers, content-length and
chunked bodies -- is httptools (llhttp, the parser uvicorn uses, installed with
``uvicorn[standard]``); this module only frames requests and pools connections.

Failure semantics match the other transports: no answer at all raises ``UpstreamFailure`` with
kind ``connect``, ``timeout`` or ``protocol``; any HTTP answer, error statuses included, is an
``UpstreamReply``. Idle connections are dropped before servers usually time them out (uvicorn,
and so vLLM, closes them after 5 s); one that had idled a while and is closed with no byte of
reply is the engine's idle timeout, not a failure, and is retried once on a fresh connection. A
connection that was busy a moment ago and closes without answering is the engine dropping the
call: that is a ``connect`` failure, never retried here -- the recorder's flow decides what the
agent sees.
"""

from __future__ import annotations

import asyncio
import re
import ssl as ssl_module
import time
from typing import Any
from urllib.parse import urlencode, urlsplit

import httptools
import orjson

from openenv_harness.recorder.upstream.base import (
    Upstream,
    UpstreamFailure,
    UpstreamReply,
    check_engine_url,
    redact_key,
)
from openenv_harness.recorder.upstream.http import AFFINITY_HEADER, SESSION_HEADER, normalize_engine_url
from openenv_harness.recorder.upstream.reply_parse import parse_engine_reply

#: An HTTP header name (RFC 9110 token)
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
#: Idle connections older than this are closed instead of reused (seconds).
IDLE_REUSE_S = 4.0
#: A reused connection that closes unanswered after idling at least this long was timed out idle.
STALE_AFTER_IDLE_S = 1.0


class _Stale(Exception):
    """The connection was closed before any byte of the response arrived."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one exchange at a time, its parser reused across responses."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._done: asyncio.Future[None] | None = None
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._got_bytes = False
        self._headers_done = False
        self._keep_alive = False
        self.idle_since = 0.0

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._done is None or self._done.done():
            self.close()  # bytes nobody asked for: this connection cannot be trusted any more
            return
        self._got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamFailure("protocol", f"engine sent malformed HTTP: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._done is None or self._done.done():
            return
        if self._headers_done and self._close_delimited():
            self._finish(keep_alive=False)  # a body that ends with the connection (no length given)
        elif not self._got_bytes:
            self._fail(_Stale())
        else:
            self._fail(UpstreamFailure("protocol", "engine closed the connection in the middle of its reply"))

    # -- httptools callbacks -------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._headers_done = True
        self._status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._finish(keep_alive=self._parser.should_keep_alive())

    # -- one exchange ----------------------------------------------------------------------------------

    def send(self, head: bytes, body: bytes | None) -> asyncio.Future[None]:
        assert self.transport is not None
        self._done = asyncio.get_running_loop().create_future()
        self._status, self._headers, self._body = 0, [], []
        self._got_bytes = self._headers_done = False
        self.transport.writelines((head, body) if body else (head,))
        return self._done

    def reply(self) -> tuple[int, dict[str, str], bytes]:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in self._headers}
        return self._status, headers, b"".join(self._body)

    @property
    def reusable(self) -> bool:
        return self._keep_alive and not self.closed

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _close_delimited(self) -> bool:
        names = {k.lower() for k, _ in self._headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def _finish(self, *, keep_alive: bool) -> None:
        self._keep_alive = keep_alive
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)


class H1Engine(Upstream):
    """An engine reached over HTTP/1.1. ``base_url`` is the server root (``/v1`` is appended)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        api_key: str | None = None,
        max_connections: int = 512,
        affinity_header: str | None = AFFINITY_HEADER,
    ) -> None:
        check_engine_url(base_url)
        if affinity_header is not None and not _TOKEN.match(affinity_header):
            raise ValueError(f"affinity header must be an HTTP header name, got {affinity_header!r}")
        self.base_url = normalize_engine_url(base_url)
        self.name = self.base_url  # what the records name as the engine: its URL (a white-box step names itself)
        self._api_key = api_key
        self._affinity_header = affinity_header
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"engine URL must be http(s)://host[:port][/prefix], got {base_url!r}")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl: ssl_module.SSLContext | None = ssl_module.create_default_context() if parts.scheme == "https" else None
        self._prefix = parts.path.rstrip("/")
        fixed = [f"Host: {parts.netloc}", "User-Agent: openenv-harness", "Accept: application/json"]
        if api_key:
            fixed.append(f"Authorization: Bearer {api_key}")
        self._fixed_headers = "\r\n".join(fixed)
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._idle: list[_Connection] = []
        self._slots: asyncio.Semaphore | None = None

    async def start(self) -> None:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._max_connections)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        self._slots = None

    async def chat(self, body: dict[str, Any], *, session_id: str, affinity: str | None = None) -> UpstreamReply:
        return await self._send("POST", "/v1/chat/completions", orjson.dumps(body),
                                extra=self._session_headers(session_id, affinity), chat=True)

    exact_ids = True

    async def post_for_session(self, path: str, body: dict[str, Any], *, session_id: str,
                               affinity: str | None = None) -> UpstreamReply:
        return await self._send("POST", path, orjson.dumps(body), extra=self._session_headers(session_id, affinity))

    def _session_headers(self, session_id: str, affinity: str | None) -> tuple[str, ...]:
        if affinity and self._affinity_header:
            return f"{SESSION_HEADER}: {session_id}", f"{self._affinity_header}: {affinity}"
        return (f"{SESSION_HEADER}: {session_id}",)

    async def request(
        self, method: str, path: str, *, json: Any = None, params: dict[str, str] | None = None
    ) -> UpstreamReply:
        if params:
            path = f"{path}?{urlencode(params)}"
        return await self._send(method, path, orjson.dumps(json) if json is not None else None)

    # -- the exchange --------------------------------------------------------------------------------

    async def _send(self, method: str, path: str, body: bytes | None, *, extra: tuple[str, ...] = (),
                    chat: bool = False) -> UpstreamReply:
        if self._slots is None:
            raise RuntimeError("H1Engine.start() was not awaited")
        if any(c in line for line in extra for c in "\r\n"):
            raise ValueError("header values may not contain line breaks")
        lines = [f"{method} {self._prefix}{path} HTTP/1.1", self._fixed_headers]
        if body is not None:
            lines.append(f"Content-Type: application/json\r\nContent-Length: {len(body)}")
        elif method in ("POST", "PUT", "PATCH"):
            lines.append("Content-Length: 0")
        lines.extend(extra)
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        started = time.perf_counter()
        async with self._slots:
            status, headers, raw = await self._exchange(head, body)
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        if status != 200:
            raw = redact_key(raw, self._api_key)
        parsed, span, doubts = parse_engine_reply(raw, status=status, chat=chat)
        return UpstreamReply(status=status, json=parsed, prompt_span=span, body=raw, headers=headers,
                             elapsed_ms=elapsed_ms, doubts=doubts)

    async def _exchange(self, head: bytes, body: bytes | None) -> tuple[int, dict[str, str], bytes]:
        for attempt in range(2):
            conn, idled = await self._acquire()
            try:
                async with asyncio.timeout(self._timeout_s):
                    await conn.send(head, body)
            except _Stale:
                conn.close()
                if idled >= STALE_AFTER_IDLE_S and attempt == 0:
                    continue  # the engine timed out an idle connection: the request never reached it
                raise UpstreamFailure("connect", "engine closed the connection before answering") from None
            except TimeoutError:
                conn.close()
                raise UpstreamFailure("timeout", f"engine timed out after {self._timeout_s:g}s") from None
            except BaseException:  # a protocol error, or the caller was cancelled mid-exchange
                conn.close()
                raise
            reply = conn.reply()
            if conn.reusable:
                conn.idle_since = time.monotonic()
                self._idle.append(conn)
            else:
                conn.close()
            return reply
        raise AssertionError("unreachable")

    async def _acquire(self) -> tuple[_Connection, float]:
        """A connection, and how long it had been idle (0 for a new one)."""
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            idled = now - conn.idle_since
            if not conn.closed and idled < IDLE_REUSE_S:
                return conn, idled
            conn.close()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, conn = await loop.create_connection(_Connection, self._host, self._port, ssl=self._ssl)
        except TimeoutError:
            raise UpstreamFailure("timeout", f"engine did not accept a connection in {self._connect_timeout_s:g}s") from None
        except OSError as exc:
            raise UpstreamFailure("connect", f"engine unreachable: {type(exc).__name__}: {exc}") from None
        return conn, 0.0
