"""The relay framing protocol: frames, heads, windows, header hygiene."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openenv_harness.relay import protocol as wire
from openenv_harness.relay.protocol import FrameKind, ProtocolError


def test_frame_round_trip_keeps_kind_stream_and_payload() -> None:
    data = wire.encode_frame(FrameKind.RESPONSE_BODY, 7, b"hello")
    assert data[:5] == bytes([0x21, 0, 0, 0, 7])
    frame = wire.decode_frame(data)
    assert (frame.kind, frame.stream, frame.payload) == (FrameKind.RESPONSE_BODY, 7, b"hello")


@given(
    kind=st.sampled_from([k for k in FrameKind if k not in wire.CONNECTION_KINDS]),
    stream=st.integers(min_value=1, max_value=2**32 - 1),
    payload=st.binary(max_size=2048),
)
def test_any_call_frame_round_trips(kind: FrameKind, stream: int, payload: bytes) -> None:
    frame = wire.decode_frame(wire.encode_frame(kind, stream, payload))
    assert frame == wire.Frame(kind, stream, payload)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\x21\x00", "shorter than"),
        (bytes([0x7F, 0, 0, 0, 1]), "unknown frame kind 0x7f"),
        (bytes([FrameKind.PING, 0, 0, 0, 3]), "PING frame on stream 3"),
        (bytes([FrameKind.REQUEST_BODY, 0, 0, 0, 0]), "REQUEST_BODY frame on stream 0"),
        (bytes([FrameKind.RESPONSE_BODY, 0, 0, 0, 1]) + b"x" * (wire.MAX_CHUNK + 1), "exceeds"),
    ],
)
def test_malformed_frames_are_refused_with_a_reason(data: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        wire.decode_frame(data)


def test_encoder_refuses_what_the_decoder_would_refuse() -> None:
    with pytest.raises(ProtocolError, match="stream 0 only"):
        wire.encode_frame(FrameKind.HELLO, 1)
    with pytest.raises(ProtocolError, match="non-zero stream"):
        wire.encode_frame(FrameKind.REQUEST_END, 0)
    with pytest.raises(ProtocolError, match="exceeds"):
        wire.encode_frame(FrameKind.REQUEST_BODY, 1, b"x" * (wire.MAX_CHUNK + 1))
    with pytest.raises(ProtocolError, match="out of range"):
        wire.encode_frame(FrameKind.CANCEL, 2**32)


def test_request_head_round_trip_and_validation() -> None:
    head = wire.RequestHead("POST", "/rollout/s/v1/chat/completions?x=1", [("Content-Type", "application/json")])
    assert wire.RequestHead.decode(wire.decode_frame(head.encode(3))) == head
    no_body = wire.RequestHead("GET", "/v1/models", [], has_body=False)
    assert wire.RequestHead.decode(wire.decode_frame(no_body.encode(4))).has_body is False

    def decode(value: object) -> wire.RequestHead:
        return wire.RequestHead.decode(wire.decode_frame(wire.json_frame(FrameKind.REQUEST_HEAD, 1, value)))  # type: ignore[arg-type]

    good = {"method": "POST", "path": "/x", "headers": [], "body": True}
    assert decode(good).path == "/x"
    with pytest.raises(ProtocolError, match="method"):
        decode({**good, "method": "post"})
    with pytest.raises(ProtocolError, match="path"):
        decode({**good, "path": "http://elsewhere/x"})
    with pytest.raises(ProtocolError, match="malformed header"):
        decode({**good, "headers": [["X-Evil", "a\r\nInjected: 1"]]})
    with pytest.raises(ProtocolError, match="pairs"):
        decode({**good, "headers": [["only-name"]]})
    with pytest.raises(ProtocolError, match="body"):
        decode({k: v for k, v in good.items() if k != "body"})
    with pytest.raises(ProtocolError, match="not JSON"):
        wire.RequestHead.decode(wire.Frame(FrameKind.REQUEST_HEAD, 1, b"{nope"))


def test_response_head_status_must_be_a_final_http_status() -> None:
    head = wire.ResponseHead(200, [("content-type", "text/event-stream")])
    assert wire.ResponseHead.decode(wire.decode_frame(head.encode(9))) == head
    for bad in (101, 600, True, "200"):
        frame = wire.decode_frame(wire.json_frame(FrameKind.RESPONSE_HEAD, 1, {"status": bad, "headers": []}))
        with pytest.raises(ProtocolError, match="status"):
            wire.ResponseHead.decode(frame)


def test_window_frames_carry_a_positive_increment() -> None:
    assert wire.decode_frame(wire.window_frame(5, 65536)).window_increment() == 65536
    with pytest.raises(ProtocolError):
        wire.window_frame(5, 0)
    with pytest.raises(ProtocolError, match="positive"):
        wire.Frame(FrameKind.WINDOW, 5, b"\x00\x00\x00\x00").window_increment()
    with pytest.raises(ProtocolError, match="4 bytes"):
        wire.Frame(FrameKind.WINDOW, 5, b"\x01").window_increment()


@given(st.binary(max_size=300_000), st.integers(min_value=1, max_value=70_000))
def test_body_pieces_rejoin_to_the_body_and_respect_the_size(body: bytes, size: int) -> None:
    pieces = list(wire.body_pieces(body, size))
    assert b"".join(pieces) == body
    assert all(0 < len(piece) <= size for piece in pieces)


def test_forwardable_headers_drop_hop_by_hop_and_connection_named_ones() -> None:
    headers = [
        ("Host", "127.0.0.1:9"), ("Connection", "keep-alive, X-Private"), ("X-Private", "1"),
        ("Transfer-Encoding", "chunked"), ("Keep-Alive", "timeout=5"), ("Expect", "100-continue"),
        ("Authorization", "Bearer k"), ("Content-Type", "application/json"),
    ]
    assert wire.forwardable_headers(headers, drop=("host",)) == [
        ("Authorization", "Bearer k"), ("Content-Type", "application/json"),
    ]


def test_redaction_blanks_every_credential_header() -> None:
    headers = [("Authorization", "Bearer sk-1"), ("X-Sandbox-Token", "t"), ("x-api-key", "k"),
               ("X-Relay-Token", "r"), ("Content-Type", "application/json")]
    redacted = wire.redact_headers(headers)
    assert redacted[-1] == ("Content-Type", "application/json")
    assert all(value == wire.REDACTED for _, value in redacted[:-1])
    assert "sk-1" not in json.dumps(redacted)


async def test_stream_window_blocks_until_credit_is_granted() -> None:
    window = wire.StreamWindow(wire.MAX_CHUNK)
    await window.acquire(wire.MAX_CHUNK)
    waiter = asyncio.ensure_future(window.acquire(10))
    await asyncio.sleep(0.05)
    assert not waiter.done(), "sending past the window must wait"
    window.grant(5)
    await asyncio.sleep(0.02)
    assert not waiter.done(), "5 bytes of credit do not cover a 10-byte piece"
    window.grant(5)
    await asyncio.wait_for(waiter, 1)
    assert window.credit == 0


async def test_stream_window_failure_wakes_waiters() -> None:
    window = wire.StreamWindow(wire.MAX_CHUNK)
    await window.acquire(wire.MAX_CHUNK)
    waiter = asyncio.ensure_future(window.acquire(1))
    await asyncio.sleep(0.01)
    window.fail(ConnectionError("link gone"))
    with pytest.raises(ConnectionError, match="link gone"):
        await asyncio.wait_for(waiter, 1)


def test_windows_smaller_than_a_piece_are_refused() -> None:
    with pytest.raises(ProtocolError, match="below one body piece"):
        wire.StreamWindow(wire.MAX_CHUNK - 1)


def test_receive_window_catches_a_peer_that_ignores_credit() -> None:
    window = wire.ReceiveWindow(wire.MAX_CHUNK)
    window.consume(60)
    with pytest.raises(ProtocolError, match=f"only {wire.MAX_CHUNK - 60} bytes of credit"):
        window.consume(wire.MAX_CHUNK - 59)
    assert window.release(60) == 60, "a one-piece window must hand every byte back at once"
    window.consume(wire.MAX_CHUNK)


def test_receive_window_batches_grants_without_starving_a_blocked_sender() -> None:
    size = 4 * wire.MAX_CHUNK
    window = wire.ReceiveWindow(size)
    window.consume(1000)
    assert window.release(1000) == 0, "small calls cost no WINDOW frame"
    window.consume(size - 1000)
    assert window.release(size // 4 - 1000) == size // 4, "a quarter window goes back in one frame"
    assert window.release(size - size // 4 - 1000) == size - size // 4 - 1000


@given(window=st.integers(min_value=wire.MAX_CHUNK, max_value=1 << 22), pieces=st.lists(
    st.integers(min_value=1, max_value=wire.MAX_CHUNK), min_size=1, max_size=200))
def test_flow_control_never_deadlocks(window: int, pieces: list[int]) -> None:
    """A sender that can send a piece only with enough credit, and a receiver that passes every
    piece on at once, always complete: the batched grants unblock every wait."""
    credit, receiver = window, wire.ReceiveWindow(window)
    for piece in pieces:
        if credit < piece:
            raise AssertionError(f"deadlock: {credit} bytes of credit for a {piece}-byte piece")
        credit -= piece
        receiver.consume(piece)
        credit += receiver.release(piece)
