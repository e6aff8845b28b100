"""The trainer side of the relay: dial into the sandbox, forward each relayed call to the recorder.

Why the trainer dials in (and not the sandbox out): the recorder stays on a trainer-local address
that nothing outside can reach, and every byte of token evidence stays on the trainer side. The
only way into a remote sandbox is its port proxy, so the dialer opens one WebSocket there -- with
the proxy's credentials read afresh at every connect, since bearer tokens rotate -- and keeps it
open: pings at least every 15 s, reconnects with jittered backoff when it drops. Each call the
relay announces becomes one streamed httpx request to ``target_base_url`` (the recorder's origin;
the agent's path is kept verbatim), and the reply goes back piece by piece under the protocol's
flow control, so a slow agent makes the dialer stop reading from the recorder, not buffer.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from openenv_harness.relay import protocol as wire
from openenv_harness.relay.protocol import FrameKind

log = logging.getLogger("openenv_harness.relay.dialer")


class _RedactHandshakeHeaders(logging.Filter):
    """``websockets`` logs every handshake header at DEBUG; blank out the credentials."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 2 and record.msg in ("> %s: %s", "< %s: %s"):
            if str(args[0]).lower() in wire.SECRET_HEADERS:
                record.args = (args[0], wire.REDACTED)
        return True


#: The logger handed to ``websockets`` for the relay link (handshake headers redacted).
ws_log = logging.getLogger("openenv_harness.relay.dialer.websocket")
ws_log.addFilter(_RedactHandshakeHeaders())


class RelayUnavailableError(TimeoutError):
    """The dialer could not establish a relay link in time; the message carries the last error."""


class _LinkDown(Exception):
    """The WebSocket this call was using is gone."""


class _NoRedirectConnect(connect):
    """``websockets.connect`` that refuses redirects: the upgrade carries credentials, and a
    response must not get to choose where they go next."""

    def process_redirect(self, exc: Exception) -> Exception | str:
        return exc


@dataclass
class DialerStats:
    """Counters for tests, metrics and diagnostics -- and for telling an infrastructure fault from a
    failed task (``Sandbox.infrastructure_faults``). Every started call ends as exactly one of
    completed (its whole reply went out, ``RESPONSE_END`` included, on a link that was still up),
    failed (an error reply, or cut: ``calls_cut`` counts those the link took down with it) or
    cancelled (the agent went away)."""

    connects: int = 0
    disconnects: int = 0
    calls_started: int = 0
    calls_completed: int = 0
    calls_failed: int = 0
    calls_cancelled: int = 0
    #: calls in flight when the link dropped (also counted in ``calls_failed``)
    calls_cut: int = 0
    #: Largest number of reply bytes ever sent on one call and not yet acknowledged by the relay.
    max_unacked_bytes: int = 0
    last_error: str | None = None

    def faults(self) -> list[str]:
        """What went wrong on the relay path, for a person to read (empty: nothing)."""
        found = []
        if self.disconnects:
            found.append(f"the relay link to the trainer dropped {self.disconnects} time(s) "
                         f"(last error: {self.last_error or 'none'})")
        if self.calls_cut:
            found.append(f"{self.calls_cut} relayed call(s) cut when the link dropped")
        other = self.calls_failed - self.calls_cut
        if other > 0:
            found.append(f"{other} relayed call(s) failed on the trainer side of the relay")
        return found


class _Call:
    """One relayed call in flight: its request body inbox and its flow-control state."""

    def __init__(self, stream: int, head: wire.RequestHead, own_window: int, relay_window: int) -> None:
        self.stream = stream
        self.head = head
        self.body: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.receive_window = wire.ReceiveWindow(own_window)
        self.send_window = wire.StreamWindow(relay_window)
        self.relay_window = relay_window
        self.task: asyncio.Task[None] | None = None


class _Link:
    """One open WebSocket to the relay and the calls multiplexed on it."""

    def __init__(self, ws: ClientConnection, relay_window: int) -> None:
        self.ws = ws
        self.relay_window = relay_window
        self.calls: dict[int, _Call] = {}
        self.last_heard = time.monotonic()

    async def send(self, frame: bytes) -> None:
        try:
            await self.ws.send(frame)
        except ConnectionClosed as exc:
            raise _LinkDown(str(exc)) from exc


class RelayDialer:
    """Keeps one WebSocket to an in-sandbox relay open and serves the calls that come over it.

    ``ws_url_factory`` and ``headers_factory`` are called (in a worker thread) before every
    connect attempt: pass ``lambda: sandbox.proxy_url_for(port, "/relay", scheme="wss://")`` and
    ``lambda: sandbox.proxy_headers`` so a rotated bearer is picked up on reconnect.
    """

    def __init__(
        self,
        ws_url_factory: Callable[[], str],
        headers_factory: Callable[[], Mapping[str, str]],
        target_base_url: str,
        *,
        window: int = wire.DEFAULT_WINDOW,
        ping_interval_s: float = wire.DEFAULT_PING_INTERVAL_S,
        open_timeout_s: float = 10.0,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 10.0,
        allowed_path_prefixes: Sequence[str] | None = None,
        http_client: httpx.AsyncClient | None = None,
        ws_proxy: str | bool | None = True,
        unix_socket_path: str | None = None,
    ) -> None:
        """``window``: reply bytes per call the relay may hold unacknowledged from us, and request
        bytes it may send us. ``allowed_path_prefixes``: serve only these paths (``None``: all).
        ``http_client``: a client for the target (default: one without proxies, no read timeout --
        a generation may legitimately wait out a weight-sync pause). ``ws_proxy``: as
        ``websockets.connect(proxy=)``, ``True`` honours the usual proxy environment variables.
        ``unix_socket_path``: dial this Unix socket instead of the URL's host (the URL still names the
        path and ``Host``): a container sandbox has no network, so its relay's trainer end is a socket
        in a directory both sides mount."""
        if not 0 < ping_interval_s <= wire.MAX_PING_INTERVAL_S:
            raise ValueError(f"ping_interval_s must be in (0, {wire.MAX_PING_INTERVAL_S}]")
        if window < wire.MAX_CHUNK:
            raise ValueError(f"window must be at least {wire.MAX_CHUNK} bytes")
        target = httpx.URL(target_base_url)
        if target.scheme not in ("http", "https") or not target.host:
            raise ValueError(f"target_base_url must be an http(s) URL, got {target_base_url!r}")
        self._ws_url_factory = ws_url_factory
        self._headers_factory = headers_factory
        self._target = str(target.copy_with(path="/", query=None, fragment=None)).rstrip("/")
        self._window = window
        self._ping_interval_s = ping_interval_s
        self._open_timeout_s = open_timeout_s
        self._backoff = (backoff_initial_s, backoff_max_s)
        self._prefixes: list[str] | None = None
        if allowed_path_prefixes is not None:
            self._prefixes = []
            for prefix in allowed_path_prefixes:
                self.allow_path_prefix(prefix)
        self._ws_proxy = ws_proxy
        self._unix_socket_path = unix_socket_path
        self._owns_client = http_client is None
        self._client = http_client or httpx.AsyncClient(
            timeout=httpx.Timeout(connect=10.0, read=None, write=60.0, pool=None), trust_env=False
        )
        self._connected = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._link: _Link | None = None
        self.stats = DialerStats()

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def allow_path_prefix(self, prefix: str) -> None:
        """Also serve calls whose path is ``prefix`` or below it (others get 403)."""
        clean = "/" + prefix.strip("/")
        if self._prefixes is not None and clean not in self._prefixes:
            self._prefixes.append(clean)

    async def start(self) -> None:
        """Begin dialling in the background (returns at once)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="relay-dialer")

    async def wait_connected(self, timeout_s: float) -> None:
        """Wait until a link is up; ``RelayUnavailableError`` (with the last error) otherwise."""
        try:
            await asyncio.wait_for(self._connected.wait(), timeout_s)
        except asyncio.TimeoutError:
            raise RelayUnavailableError(
                f"no relay link after {timeout_s:.1f}s (last error: {self.stats.last_error or 'none'})"
            ) from None

    async def aclose(self) -> None:
        """Stop dialling, drop the link and fail the calls in flight."""
        self._closing.set()
        if self._link is not None:
            await self._link.ws.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._owns_client:
            await self._client.aclose()

    def reconnect(self) -> None:
        """Drop the current link now and dial again (with credentials read afresh), as a proxy that
        drops it would: the calls on it fail as in any drop. On the dialer's event loop."""
        link = self._link
        if link is not None:
            self.stats.last_error = "link dropped on request"
            link.ws.transport.abort()

    async def __aenter__(self) -> "RelayDialer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the link -------------------------------------------------------------------------------

    async def _run(self) -> None:
        attempt = 0
        while not self._closing.is_set():
            try:
                url = await asyncio.to_thread(self._ws_url_factory)
                headers = dict(await asyncio.to_thread(self._headers_factory))
                where: dict[str, Any] = {"proxy": self._ws_proxy}
                if self._unix_socket_path is not None:
                    where = {"proxy": None, "unix": True, "path": self._unix_socket_path}
                async with _NoRedirectConnect(
                    url, additional_headers=headers, open_timeout=self._open_timeout_s, compression=None,
                    max_size=wire.MAX_MESSAGE_BYTES, ping_interval=None, close_timeout=2, logger=ws_log, **where,
                ) as ws:
                    if await self._session(ws):
                        attempt = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- any failure means: back off and dial again
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                log.info("relay link attempt failed: %s", self.stats.last_error)
            if self._closing.is_set():
                break
            low, high = self._backoff
            delay = min(high, low * 2**attempt) * random.uniform(0.5, 1.0)
            attempt = min(attempt + 1, 30)
            try:
                await asyncio.wait_for(self._closing.wait(), delay)
            except asyncio.TimeoutError:
                pass

    async def _session(self, ws: ClientConnection) -> bool:
        """Run one link until it drops; returns whether the handshake got through."""
        hello = {"version": wire.PROTOCOL_VERSION, "window": self._window, "ping_interval_s": self._ping_interval_s}
        await ws.send(wire.json_frame(FrameKind.HELLO, 0, hello))
        ready = wire.decode_frame(await asyncio.wait_for(ws.recv(), self._open_timeout_s))
        if ready.kind is not FrameKind.READY or ready.json().get("version") != wire.PROTOCOL_VERSION:
            raise wire.ProtocolError(f"expected READY for protocol {wire.PROTOCOL_VERSION}")
        relay_window = ready.json().get("window")
        if not isinstance(relay_window, int) or relay_window < wire.MAX_CHUNK:
            raise wire.ProtocolError("READY window must be an integer of at least one body piece")
        link = _Link(ws, relay_window)
        self._link = link
        self.stats.connects += 1
        self._connected.set()
        log.info("relay link up")
        pinger = asyncio.create_task(self._ping(link))
        try:
            async for message in ws:
                link.last_heard = time.monotonic()
                if isinstance(message, str):
                    raise wire.ProtocolError("text message on the relay link")
                await self._dispatch(link, wire.decode_frame(message))
        except ConnectionClosed as exc:
            self.stats.last_error = f"link closed: {exc}"
        except wire.ProtocolError as exc:
            self.stats.last_error = f"protocol error: {exc}"
            await ws.close(1002, "protocol error")
        finally:
            self._connected.clear()
            self._link = None
            self.stats.disconnects += 1
            pinger.cancel()
            tasks = [call.task for call in link.calls.values() if call.task is not None]
            for task in tasks:
                task.cancel()
            self.stats.calls_cut += len(tasks)
            self.stats.calls_failed += len(tasks)
            await asyncio.gather(pinger, *tasks, return_exceptions=True)
            log.info("relay link down (%s); %d calls in flight failed", self.stats.last_error, len(tasks))
        return True

    async def _ping(self, link: _Link) -> None:
        """Keep the proxy path busy and notice a silent relay (no frame for three intervals)."""
        while True:
            await asyncio.sleep(self._ping_interval_s)
            if time.monotonic() - link.last_heard > 3 * self._ping_interval_s:
                self.stats.last_error = "relay went silent"
                link.ws.transport.abort()  # a closing handshake would wait on the silent peer
                return
            try:
                await link.send(wire.encode_frame(FrameKind.PING, 0, b"%d" % time.monotonic_ns()))
            except _LinkDown:
                return

    async def _dispatch(self, link: _Link, frame: wire.Frame) -> None:
        kind = frame.kind
        if kind is FrameKind.PING:
            await link.send(wire.encode_frame(FrameKind.PONG, 0, frame.payload))
            return
        if kind is FrameKind.PONG:
            return
        if kind is FrameKind.REQUEST_HEAD:
            if frame.stream in link.calls:
                raise wire.ProtocolError(f"stream {frame.stream} reused while open")
            call = _Call(frame.stream, wire.RequestHead.decode(frame), self._window, link.relay_window)
            link.calls[frame.stream] = call
            self.stats.calls_started += 1
            call.task = asyncio.create_task(self._forward(link, call))
            return
        if kind not in (FrameKind.REQUEST_BODY, FrameKind.REQUEST_END, FrameKind.WINDOW, FrameKind.CANCEL):
            raise wire.ProtocolError(f"the relay may not send {kind.name}")
        call = link.calls.get(frame.stream)
        if call is None:
            return  # the call already finished; late frames are dropped
        if kind is FrameKind.REQUEST_BODY:
            try:
                call.receive_window.consume(len(frame.payload))
            except wire.ProtocolError as exc:
                log.warning("call %d: %s", call.stream, exc)
                await self._abandon(link, call, f"protocol error: {exc}")
                return
            call.body.put_nowait(frame.payload)
        elif kind is FrameKind.REQUEST_END:
            call.body.put_nowait(None)
        elif kind is FrameKind.WINDOW:
            call.send_window.grant(frame.window_increment())
        else:  # CANCEL: the agent went away
            self.stats.calls_cancelled += 1
            link.calls.pop(call.stream, None)
            if call.task is not None:
                call.task.cancel()

    async def _abandon(self, link: _Link, call: _Call, message: str) -> None:
        if link.calls.pop(call.stream, None) is not None:
            self.stats.calls_failed += 1
        if call.task is not None:
            call.task.cancel()
        await link.send(wire.json_frame(FrameKind.ERROR, call.stream, {"status": 502, "message": message}))

    # -- one call -------------------------------------------------------------------------------

    def _path_allowed(self, path: str) -> bool:
        if self._prefixes is None:
            return True
        bare = path.split("?", 1)[0]
        return any(p in ("/", bare) or bare.startswith(p + "/") for p in self._prefixes)

    async def _forward(self, link: _Link, call: _Call) -> None:
        head_sent = False
        try:
            if not self._path_allowed(call.head.path):
                body = b'{"error":{"message":"path not served through this relay","type":"relay_forbidden"}}'
                headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
                await link.send(wire.ResponseHead(403, headers).encode(call.stream))
                await link.send(wire.encode_frame(FrameKind.RESPONSE_BODY, call.stream, body))
                await link.send(wire.encode_frame(FrameKind.RESPONSE_END, call.stream))
                self.stats.calls_failed += 1
                return
            headers = wire.forwardable_headers(call.head.headers, drop=("host",))
            request = self._client.build_request(
                call.head.method, self._target + call.head.path, headers=headers,
                content=self._request_body(link, call) if call.head.has_body else None,
            )
            response = await self._client.send(request, stream=True)
            try:
                reply_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw]
                await link.send(wire.ResponseHead(response.status_code, wire.forwardable_headers(reply_headers))
                                .encode(call.stream))
                head_sent = True
                async for chunk in response.aiter_raw():
                    for piece in wire.body_pieces(chunk):
                        await call.send_window.acquire(len(piece))
                        unacked = call.relay_window - call.send_window.credit
                        self.stats.max_unacked_bytes = max(self.stats.max_unacked_bytes, unacked)
                        await link.send(wire.encode_frame(FrameKind.RESPONSE_BODY, call.stream, piece))
                await link.send(wire.encode_frame(FrameKind.RESPONSE_END, call.stream))
                if link.calls.pop(call.stream, None) is None:  # the link went down as the end went out
                    return  # counted as cut, with the link's other calls
                self.stats.calls_completed += 1
            finally:
                await response.aclose()
        except _LinkDown:
            self.stats.calls_failed += 1
            self.stats.calls_cut += 1
        except Exception as exc:  # noqa: BLE001 -- every failure is reported to the agent's side
            self.stats.calls_failed += 1
            reason = type(exc).__name__  # exception texts can carry URLs; the type is enough here
            log.info("call %d failed on the way to the target: %s", call.stream, reason)
            message = f"the trainer side could not complete the call ({reason})"
            payload = {"message": message} if head_sent else {"status": 502, "message": message}
            try:
                await link.send(wire.json_frame(FrameKind.ERROR, call.stream, payload))
            except _LinkDown:
                pass
        finally:
            link.calls.pop(call.stream, None)

    async def _request_body(self, link: _Link, call: _Call) -> AsyncIterator[bytes]:
        """The agent's request body as the relay streams it; credit is returned as httpx takes it."""
        while True:
            piece = await call.body.get()
            if piece is None:
                return
            yield piece
            if increment := call.receive_window.release(len(piece)):
                await link.send(wire.window_frame(call.stream, increment))
