"""HTTP/1.1 parsing on the agent side of the relay (strict framing, streaming bodies)."""

from __future__ import annotations

import asyncio

import pytest

from openenv_harness.relay.agent_http import (
    AgentReader,
    HttpError,
    encode_chunk,
    error_response,
    iter_body,
    read_request_head,
)


def reader_of(data: bytes) -> AgentReader:
    stream = asyncio.StreamReader()
    stream.feed_data(data)
    stream.feed_eof()
    return AgentReader(stream)


async def body_of(data: bytes, max_bytes: int = 1 << 20) -> tuple[list[bytes], AgentReader]:
    reader = reader_of(data)
    request = await read_request_head(reader)
    assert request is not None
    return [p async for p in iter_body(reader, request, piece=4, max_bytes=max_bytes)], reader


async def test_content_length_body_arrives_in_bounded_pieces() -> None:
    pieces, reader = await body_of(b"POST /x HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789GET")
    assert b"".join(pieces) == b"0123456789" and max(map(len, pieces)) <= 4
    assert await reader.read(10) == b"GET", "bytes after the body stay for the next request"


async def test_chunked_body_with_extensions_and_trailers() -> None:
    raw = (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n")
    pieces, _ = await body_of(raw)
    assert b"".join(pieces) == b"hello world"


@pytest.mark.parametrize(
    "raw, status",
    [
        (b"POST /x HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
        (b"POST /x HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
        (b"POST /x HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400),
        (b"POST /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
        (b"POST /x HTTP/1.1\r\nContent-Length: 100\r\n\r\n", 413),
    ],
)
async def test_ambiguous_or_bad_bodies_are_refused(raw: bytes, status: int) -> None:
    with pytest.raises(HttpError) as info:
        await body_of(raw, max_bytes=50)
    assert info.value.status == status


@pytest.mark.parametrize(
    "raw, status",
    [
        (b"GET /x HTTP/2.0\r\n\r\n", 505),
        (b"GET http://evil/x HTTP/1.1\r\n\r\n", 400),
        (b"GET /x HTTP/1.1\nHost: a\r\n\r\n", 400),
        (b"GET /x HTTP/1.1\r\n folded: yes\r\n\r\n", 400),
        (b"GET /x HTTP/1.1\r\nBad Name: 1\r\n\r\n", 400),
        (b"GET /x HTTP/1.1\r\n" + b"X-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
    ],
)
async def test_malformed_heads_are_refused(raw: bytes, status: int) -> None:
    with pytest.raises(HttpError) as info:
        await read_request_head(reader_of(raw))
    assert info.value.status == status


async def test_keep_alive_rules_follow_the_protocol_version() -> None:
    heads = {
        b"GET / HTTP/1.1\r\n\r\n": True,
        b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n": False,
        b"GET / HTTP/1.0\r\n\r\n": False,
        b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n": True,
    }
    for raw, keep in heads.items():
        request = await read_request_head(reader_of(raw))
        assert request is not None and request.keep_alive is keep, raw


async def test_clean_close_between_requests_is_not_an_error() -> None:
    assert await read_request_head(reader_of(b"")) is None
    assert await read_request_head(reader_of(b"\r\n")) is None
    with pytest.raises(HttpError, match="request line"):
        await read_request_head(reader_of(b"GET / HT"))


async def test_pushed_back_bytes_are_read_first() -> None:
    reader = reader_of(b"TTP/1.1\r\nHost: a\r\n\r\n")
    reader.push_back(b"GET /next H")
    request = await read_request_head(reader)
    assert request is not None and request.target == "/next" and request.header("host") == "a"


def test_helpers_frame_chunks_and_errors() -> None:
    assert encode_chunk(b"hello") == b"5\r\nhello\r\n"
    reply = error_response(503, "no trainer", kind="relay_unavailable", retry_after_s=2)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable") and b"Retry-After: 2" in head
    assert b'"type": "relay_unavailable"' in body and f"Content-Length: {len(body)}".encode() in head
