"""The relay's end of the trainer's WebSocket: handshake, dispatch, and the calls riding on it.

Part of the in-sandbox program (standard library only; uploaded next to ``sandbox_relay.py``).
One ``TrainerLink`` is one connected trainer; each agent call in flight on it is a ``PendingCall``
whose inbox receives the trainer's frames for that stream. When the socket ends, every call in
flight is failed with ``LinkLost`` so its agent gets a retryable error rather than a hang.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

if __package__:
    from . import protocol as wire
    from .ws_server import ServerWebSocket, WebSocketClosed
else:  # run as an uploaded script: the sibling modules sit next to this file
    import protocol as wire  # type: ignore[no-redef]
    from ws_server import ServerWebSocket, WebSocketClosed  # type: ignore[no-redef]

FrameKind = wire.FrameKind
log = logging.getLogger("sandbox-relay")

HELLO_TIMEOUT_S = 10.0
_TRAINER_KINDS = frozenset(
    {FrameKind.RESPONSE_HEAD, FrameKind.RESPONSE_BODY, FrameKind.RESPONSE_END, FrameKind.WINDOW, FrameKind.ERROR}
)


class LinkLost(Exception):
    """The trainer's WebSocket went away while a call was using it."""


class PendingCall:
    """One agent call in flight on a link: its inbox of trainer frames and its two windows."""

    def __init__(self, stream: int, peer_window: int, own_window: int) -> None:
        self.stream = stream
        self.inbox: asyncio.Queue[object] = asyncio.Queue()
        self.send_window = wire.StreamWindow(peer_window)
        self.receive_window = wire.ReceiveWindow(own_window)
        self.body_complete = False


class TrainerLink:
    """One connected trainer WebSocket and the calls multiplexed on it.

    ``on_ready`` runs once the HELLO/READY handshake is through (the link may carry calls),
    ``on_closed`` once it is gone; ``own_window`` is the reply window this side grants per call.
    """

    def __init__(
        self,
        ws: ServerWebSocket,
        *,
        own_window: int,
        on_ready: Callable[["TrainerLink"], None],
        on_closed: Callable[["TrainerLink"], None],
    ) -> None:
        self.ws = ws
        self.own_window = own_window
        self._on_ready = on_ready
        self._on_closed = on_closed
        self.peer_window = wire.DEFAULT_WINDOW
        self.calls: dict[int, PendingCall] = {}
        self.closed = False

    async def send(self, frame: bytes) -> None:
        if self.closed:
            raise LinkLost("the trainer link is closed")
        try:
            await self.ws.send(frame)
        except (WebSocketClosed, ConnectionError) as exc:
            self.close("send failed")
            raise LinkLost("the trainer link dropped") from exc

    def open_call(self, stream: int) -> PendingCall:
        call = PendingCall(stream, self.peer_window, self.own_window)
        self.calls[stream] = call
        return call

    def forget(self, stream: int) -> None:
        self.calls.pop(stream, None)

    def close(self, reason: str) -> None:
        """Fail every call in flight and drop the socket."""
        if self.closed:
            return
        self.closed = True
        log.info("trainer link closed: %s (%d calls in flight failed)", reason, len(self.calls))
        lost = LinkLost(reason)
        for call in self.calls.values():
            call.send_window.fail(lost)
            call.inbox.put_nowait(lost)
        self.calls.clear()
        self.ws.abort()
        self._on_closed(self)

    async def run(self) -> None:
        """Handshake (HELLO/READY), then dispatch trainer frames until the socket ends."""
        reason = "socket ended"
        try:
            hello = wire.decode_frame(await asyncio.wait_for(self.ws.receive(), HELLO_TIMEOUT_S))
            if hello.kind is not FrameKind.HELLO:
                raise wire.ProtocolError(f"expected HELLO, got {hello.kind.name}")
            info = hello.json()
            if info.get("version") != wire.PROTOCOL_VERSION:
                raise wire.ProtocolError(f"unsupported protocol version {info.get('version')!r}")
            window = info.get("window")
            interval = info.get("ping_interval_s")
            if not isinstance(window, int) or window < wire.MAX_CHUNK:
                raise wire.ProtocolError("HELLO window must be an integer of at least one body piece")
            if not isinstance(interval, (int, float)) or not 0 < interval <= wire.MAX_PING_INTERVAL_S:
                raise wire.ProtocolError("HELLO ping_interval_s must be in (0, 15]")
            self.peer_window = window
            await self.ws.send(
                wire.json_frame(FrameKind.READY, 0, {"version": wire.PROTOCOL_VERSION, "window": self.own_window})
            )
            self._on_ready(self)
            while True:
                message = await asyncio.wait_for(self.ws.receive(), 3 * interval)
                await self._dispatch(wire.decode_frame(message))
        except asyncio.TimeoutError:
            reason = "trainer went silent"
        except wire.ProtocolError as exc:
            reason = f"protocol error: {exc}"
            await self.ws.close(1002, "protocol error")
        except WebSocketClosed as exc:
            reason = str(exc)
        except (ConnectionError, LinkLost) as exc:
            reason = f"connection error: {exc}"
        finally:
            self.close(reason)

    async def _dispatch(self, frame: wire.Frame) -> None:
        kind = frame.kind
        if kind is FrameKind.PING:
            await self.send(wire.encode_frame(FrameKind.PONG, 0, frame.payload[:64]))
            return
        if kind is FrameKind.PONG:
            return
        if kind not in _TRAINER_KINDS:
            raise wire.ProtocolError(f"the trainer may not send {kind.name}")
        call = self.calls.get(frame.stream)
        if call is None:  # the call already ended (agent gone, cancelled): late frames are dropped
            return
        if kind is FrameKind.WINDOW:
            call.send_window.grant(frame.window_increment())
            return
        if kind is FrameKind.RESPONSE_BODY:
            try:
                call.receive_window.consume(len(frame.payload))
            except wire.ProtocolError as exc:
                call.inbox.put_nowait(exc)
                return
        call.inbox.put_nowait(frame)
