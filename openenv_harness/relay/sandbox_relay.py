"""The in-sandbox relay: agent HTTP calls on localhost, tunnelled over the trainer's WebSocket.

Why it exists: inside a remote sandbox the agent only knows an OpenAI base URL. This program gives
it one on ``127.0.0.1`` and carries every call over the single WebSocket the trainer dials in
through the sandbox's port proxy (see ``protocol.py`` for the framing). It relays and nothing
else: it records nothing, keeps no token data and holds at most one flow-control window of any
reply in memory.

Run it as a script, with ``protocol.py``, ``ws_server.py``, ``agent_http.py`` and ``trainer_link.py``
next to it::

    python3 sandbox_relay.py --http-port 0 --ws-port 0 --idle-exit-s 120 --token-env RELAY_TOKEN

It prints one JSON line, ``{"event": "ready", "http_port": ..., "ws_port": ...}``, once both
listeners are bound (``0`` picks a free port), and logs to stderr. Standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence

if __package__:
    from . import protocol as wire
    from .agent_http import (
        LAST_CHUNK,
        AgentReader,
        AgentRequest,
        HttpError,
        encode_chunk,
        error_response,
        iter_body,
        read_request_head,
        response_head,
    )
    from .trainer_link import LinkLost, PendingCall, TrainerLink
    from .ws_server import ServerWebSocket, handshake_response, upgrade_problem
else:  # run as an uploaded script: the sibling modules sit next to this file
    import protocol as wire  # type: ignore[no-redef]
    from agent_http import (  # type: ignore[no-redef]
        LAST_CHUNK,
        AgentReader,
        AgentRequest,
        HttpError,
        encode_chunk,
        error_response,
        iter_body,
        read_request_head,
        response_head,
    )
    from trainer_link import LinkLost, PendingCall, TrainerLink  # type: ignore[no-redef]
    from ws_server import ServerWebSocket, handshake_response, upgrade_problem  # type: ignore[no-redef]

FrameKind = wire.FrameKind
log = logging.getLogger("sandbox-relay")

NO_BODY_STATUSES = frozenset({204, 304})


class _AgentGone:
    """Marker queued for a call whose agent hung up."""


class _BadRequest:
    """Marker queued for a call whose request body could not be read."""

    def __init__(self, error: HttpError) -> None:
        self.error = error


class Relay:
    """The relay's state: the current trainer link, the agent listeners and the watchdog."""

    def __init__(
        self,
        *,
        token: str | None,
        window: int,
        connect_wait_s: float,
        retry_after_s: int,
        idle_exit_s: float,
        max_body_bytes: int,
    ) -> None:
        self.token = token
        self.window = window
        self.connect_wait_s = connect_wait_s
        self.retry_after_s = retry_after_s
        self.idle_exit_s = idle_exit_s
        self.max_body_bytes = max_body_bytes
        self.link: TrainerLink | None = None
        self.link_ready = asyncio.Event()
        self.unlinked_since = time.monotonic()
        self.stopping = asyncio.Event()
        self._next_stream = 0

    # -- trainer side ---------------------------------------------------------------------------

    def attach(self, link: TrainerLink) -> None:
        previous, self.link = self.link, link
        self.link_ready.set()
        log.info("trainer connected")
        if previous is not None:
            previous.close("replaced by a newer trainer connection")

    def detach(self, link: TrainerLink) -> None:
        if self.link is link:
            self.link = None
            self.link_ready.clear()
            self.unlinked_since = time.monotonic()

    async def handle_trainer(self, raw_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reader = AgentReader(raw_reader)
        try:
            request = await read_request_head(reader)
            if request is None:
                return
            path = request.target.split("?", 1)[0]
            problem = None if path == wire.RELAY_WS_PATH else (404, "unknown path")
            if problem is None and self.token is not None:
                offered = request.header(wire.RELAY_TOKEN_HEADER) or ""
                if not hmac.compare_digest(offered.encode(), self.token.encode()):
                    problem = (401, "missing or wrong relay token")
            if problem is None:
                lowered = {name.lower(): value for name, value in request.headers}
                reason = upgrade_problem(request.method, lowered)
                problem = None if reason is None else (400, reason)
            if problem is not None:
                log.warning("refused a trainer connection: %s", problem[1])
                writer.write(error_response(problem[0], problem[1], kind="relay_refused"))
                await writer.drain()
                return
            writer.write(handshake_response(request.header("sec-websocket-key") or ""))
            await writer.drain()
            ws = ServerWebSocket(reader, writer, max_message_bytes=wire.MAX_MESSAGE_BYTES)
            await TrainerLink(ws, own_window=self.window, on_ready=self.attach, on_closed=self.detach).run()
        except (HttpError, ConnectionError, asyncio.IncompleteReadError) as exc:
            log.warning("trainer connection failed during the handshake: %s", exc)
        finally:
            writer.transport.abort()

    async def wait_for_link(self) -> TrainerLink | None:
        if self.link is None:
            try:
                await asyncio.wait_for(self.link_ready.wait(), self.connect_wait_s)
            except asyncio.TimeoutError:
                return None
        return self.link

    async def watchdog(self) -> None:
        """Exit when no trainer has been connected for ``idle_exit_s`` (a dead trainer must not
        keep a billed sandbox alive through this tracked process)."""
        if self.idle_exit_s <= 0:
            return
        while True:
            await asyncio.sleep(min(1.0, self.idle_exit_s / 4))
            if self.link is None and time.monotonic() - self.unlinked_since >= self.idle_exit_s:
                log.info("no trainer connected for %.1fs: exiting", self.idle_exit_s)
                self.stopping.set()
                return

    # -- agent side -----------------------------------------------------------------------------

    async def handle_agent(self, raw_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reader = AgentReader(raw_reader)
        try:
            while True:
                try:
                    request = await read_request_head(reader)
                except HttpError as exc:
                    writer.write(error_response(exc.status, exc.message, kind="invalid_request_error"))
                    await writer.drain()
                    return
                if request is None or not await self._serve_call(request, reader, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if not writer.transport.is_closing():
                writer.close()

    async def _serve_call(self, request: AgentRequest, reader: AgentReader, writer: asyncio.StreamWriter) -> bool:
        """Relay one call; returns whether the agent's connection may carry another."""
        try:
            has_body = request.body_length() != 0
        except HttpError as exc:
            writer.write(error_response(exc.status, exc.message, kind="invalid_request_error"))
            await writer.drain()
            return False
        link = await self.wait_for_link()
        if link is None:
            writer.write(error_response(
                503, "no trainer is connected to the model relay yet", kind="relay_unavailable",
                retry_after_s=self.retry_after_s,
            ))
            await writer.drain()
            return False
        self._next_stream = self._next_stream % (2**32 - 1) + 1
        call = link.open_call(self._next_stream)
        headers = wire.forwardable_headers(request.headers)
        log.debug("call %d: %s with headers %s", call.stream, request.method, wire.redact_headers(headers))
        try:
            await link.send(wire.RequestHead(request.method, request.target, headers, has_body).encode(call.stream))
        except LinkLost:
            link.forget(call.stream)
            writer.write(error_response(502, "the model relay lost its trainer link", kind="relay_error"))
            await writer.drain()
            return False
        if request.expects_continue:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        pump = asyncio.ensure_future(self._pump_request(request, reader, link, call))
        try:
            return await self._relay_reply(request, writer, link, call)
        finally:
            link.forget(call.stream)
            if not pump.done():
                pump.cancel()  # stops the hang-up watch (or an unread body: the connection closes)
            leftover = (await asyncio.gather(pump, return_exceptions=True))[0]
            if isinstance(leftover, bytes) and leftover:
                reader.push_back(leftover)

    async def _pump_request(
        self, request: AgentRequest, reader: AgentReader, link: TrainerLink, call: PendingCall
    ) -> bytes:
        """Stream the request body to the trainer under flow control, then watch for a hang-up.

        Returns the start of a pipelined next request if one arrived while watching.
        """
        try:
            async for piece in iter_body(reader, request, piece=wire.MAX_CHUNK, max_bytes=self.max_body_bytes):
                await call.send_window.acquire(len(piece))
                await link.send(wire.encode_frame(FrameKind.REQUEST_BODY, call.stream, piece))
            await link.send(wire.encode_frame(FrameKind.REQUEST_END, call.stream))
        except HttpError as exc:
            call.inbox.put_nowait(_BadRequest(exc))
            return b""
        except (asyncio.IncompleteReadError, ConnectionError):
            call.inbox.put_nowait(_AgentGone())
            return b""
        except LinkLost:
            return b""  # the link already queued LinkLost for this call
        except Exception as exc:  # noqa: BLE001 -- a bug here must fail the call, not hang it
            log.exception("call %d: reading the request failed", call.stream)
            call.inbox.put_nowait(_BadRequest(HttpError(500, f"the relay failed reading the request: {exc}")))
            return b""
        call.body_complete = True
        data = await reader.read(1)  # returns when the agent sends more (pipelining) or hangs up
        if not data:
            call.inbox.put_nowait(_AgentGone())
        return data

    async def _relay_reply(
        self, request: AgentRequest, writer: asyncio.StreamWriter, link: TrainerLink, call: PendingCall
    ) -> bool:
        """Write the trainer's reply to the agent as its frames arrive; see ``_serve_call``."""
        started = time.monotonic()
        head_sent = False
        has_body = request.method != "HEAD"
        chunked = request.version == "HTTP/1.1"
        status = 0
        sent = 0
        while True:
            item = await call.inbox.get()
            if isinstance(item, _AgentGone):
                await self._cancel(link, call, "agent disconnected")
                return False
            if isinstance(item, _BadRequest):
                await self._cancel(link, call, "bad request")
                if not head_sent:
                    writer.write(error_response(item.error.status, item.error.message, kind="invalid_request_error"))
                    await writer.drain()
                return False
            if isinstance(item, (LinkLost, wire.ProtocolError)):
                if isinstance(item, wire.ProtocolError):
                    log.warning("call %d: %s", call.stream, item)
                    await self._cancel(link, call, "protocol error")
                return await self._fail_reply(writer, head_sent, 502, f"the model relay failed: {item}")
            assert isinstance(item, wire.Frame)
            if item.kind is FrameKind.RESPONSE_HEAD and not head_sent:
                head = wire.ResponseHead.decode(item)
                status = head.status
                has_body = has_body and status not in NO_BODY_STATUSES
                out_headers = wire.forwardable_headers(head.headers, drop=("content-length",) if has_body else ())
                if has_body and chunked:
                    out_headers.append(("Transfer-Encoding", "chunked"))
                out_headers.append(("Connection", "keep-alive" if request.keep_alive and chunked else "close"))
                writer.write(response_head(status, out_headers, version=request.version))
                head_sent = True
            elif item.kind is FrameKind.RESPONSE_BODY and head_sent:
                if has_body and item.payload:
                    writer.write(encode_chunk(item.payload) if chunked else item.payload)
                    sent += len(item.payload)
                    try:
                        await writer.drain()  # a slow agent holds the credit back here
                    except ConnectionError:
                        await self._cancel(link, call, "agent disconnected")
                        return False
                increment = call.receive_window.release(len(item.payload))
                if increment:
                    try:
                        await link.send(wire.window_frame(call.stream, increment))
                    except LinkLost:
                        continue  # LinkLost is queued for this call as well
            elif item.kind is FrameKind.RESPONSE_END and head_sent:
                if has_body and chunked:
                    writer.write(LAST_CHUNK)
                await writer.drain()
                log.debug("call %d: %d, %d body bytes in %.3fs", call.stream, status, sent, time.monotonic() - started)
                return request.keep_alive and chunked and call.body_complete
            elif item.kind is FrameKind.ERROR:
                info = item.json()
                message = str(info.get("message") or "the trainer side failed the call")
                log.info("call %d failed on the trainer side: %s", call.stream, message)
                code = info.get("status")
                code = code if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599 else 502
                return await self._fail_reply(writer, head_sent, code, message)
            else:
                log.warning("call %d: unexpected %s from the trainer", call.stream, item.kind.name)
                await self._cancel(link, call, "protocol error")
                return await self._fail_reply(writer, head_sent, 502, "the model relay got an invalid reply")

    @staticmethod
    async def _fail_reply(writer: asyncio.StreamWriter, head_sent: bool, status: int, message: str) -> bool:
        """Before the head: a retryable error reply. After it: cut the connection, so the agent
        sees an incomplete stream rather than a clean (and wrong) end."""
        if head_sent:
            writer.transport.abort()
        else:
            writer.write(error_response(status, message, kind="relay_error"))
            await writer.drain()
        return False

    async def _cancel(self, link: TrainerLink, call: PendingCall, reason: str) -> None:
        link.forget(call.stream)
        try:
            await link.send(wire.json_frame(FrameKind.CANCEL, call.stream, {"reason": reason}))
        except LinkLost:
            pass


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Relay agent HTTP calls to a trainer over one WebSocket.")
    agent = parser.add_mutually_exclusive_group(required=True)
    agent.add_argument("--http-port", type=int, help="TCP port on 127.0.0.1 for the agent (0: any free)")
    agent.add_argument("--http-unix", help="unix socket path for the agent instead of TCP")
    trainer = parser.add_mutually_exclusive_group(required=True)
    trainer.add_argument("--ws-port", type=int, help="TCP port on 127.0.0.1 for the trainer (0: any free)")
    trainer.add_argument("--ws-unix", help="unix socket for the trainer, e.g. $SBX_PROXY_DIR/<port>.sock")
    parser.add_argument("--idle-exit-s", type=float, default=600.0, help="exit after this long without a trainer")
    parser.add_argument("--connect-wait-s", type=float, default=10.0, help="how long a call waits for a trainer")
    parser.add_argument("--retry-after-s", type=int, default=2, help="Retry-After sent with a 503")
    parser.add_argument("--window-bytes", type=int, default=wire.DEFAULT_WINDOW, help="per-call reply window")
    parser.add_argument("--max-body-bytes", type=int, default=256 * 1024 * 1024)
    parser.add_argument("--token-env", help="environment variable holding the secret a trainer must present")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    token = os.environ.pop(args.token_env, None) if args.token_env else None
    if args.token_env and not token:
        log.error("environment variable %s is empty: refusing to run without the relay token", args.token_env)
        return 2
    relay = Relay(
        token=token, window=max(args.window_bytes, wire.MAX_CHUNK), connect_wait_s=args.connect_wait_s,
        retry_after_s=args.retry_after_s, idle_exit_s=args.idle_exit_s, max_body_bytes=args.max_body_bytes,
    )
    servers: list[asyncio.base_events.Server] = []
    if args.http_unix:
        servers.append(await asyncio.start_unix_server(relay.handle_agent, path=_fresh_socket(args.http_unix)))
    else:
        servers.append(await asyncio.start_server(relay.handle_agent, "127.0.0.1", args.http_port))
    if args.ws_unix:
        servers.append(await asyncio.start_unix_server(relay.handle_trainer, path=_fresh_socket(args.ws_unix)))
        # the trainer may be another user than this program (a container's own user): it needs write
        # permission on the socket to connect; the relay token, not the file mode, guards the link
        os.chmod(args.ws_unix, 0o666)
    else:
        servers.append(await asyncio.start_server(relay.handle_trainer, "127.0.0.1", args.ws_port))
    ready = {
        "event": "ready",
        "version": wire.PROTOCOL_VERSION,
        "pid": os.getpid(),
        "http_port": None if args.http_unix else servers[0].sockets[0].getsockname()[1],
        "http_unix": args.http_unix,
        "ws_port": None if args.ws_unix else servers[1].sockets[0].getsockname()[1],
        "ws_unix": args.ws_unix,
    }
    print(json.dumps(ready), flush=True)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, relay.stopping.set)
    watchdog = asyncio.ensure_future(relay.watchdog())
    await relay.stopping.wait()
    watchdog.cancel()
    for server in servers:
        server.close()
    if relay.link is not None:
        relay.link.close("relay shutting down")
    return 0


def _fresh_socket(path: str) -> str:
    if os.path.exists(path):
        os.unlink(path)  # a stale socket from an earlier run would make the bind fail
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(asctime)s sandbox-relay %(levelname)s %(message)s"
    )
    return asyncio.run(serve(args))


if __name__ == "__main__":
    sys.exit(main())
