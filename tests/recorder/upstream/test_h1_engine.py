"""The engine transport: keep-alive HTTP/1.1 on httptools, against scripted raw servers on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import AsyncIterator

import orjson
import pytest

from openenv_harness.recorder.upstream import h1_engine
from openenv_harness.recorder.upstream.base import UpstreamFailure
from openenv_harness.recorder.upstream.h1_engine import H1Engine
from openenv_harness.recorder.upstream.http import SESSION_HEADER

Handler = Callable[[int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

REPLY = orjson.dumps({"choices": [{"index": 0, "token_ids": [5], "finish_reason": "stop",
                                   "message": {"role": "assistant", "content": "hi"}}],
                      "prompt_token_ids": [1, 2, 3]})


class RawServer:
    """A loopback server whose connections are handed to ``handler(number, reader, writer)``."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task] = set()

    async def __aenter__(self) -> "RawServer":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        return request

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await self.handler(self.connections, reader, writer)
        except asyncio.CancelledError:
            pass
        finally:
            writer.close()
            self.tasks.discard(task)


def ok(body: bytes = REPLY, *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", "Content-Type: application/json", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


@pytest.fixture
async def engine_for() -> AsyncIterator[Callable[..., Awaitable[H1Engine]]]:
    engines: list[H1Engine] = []

    async def make(url: str, **kwargs: object) -> H1Engine:
        engine = H1Engine(url, **kwargs)  # type: ignore[arg-type]
        await engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.aclose()


async def test_requests_are_framed_exactly_and_connections_kept_alive(engine_for) -> None:
    async def handler(number, reader, writer):
        while await server.read_request(reader) is not None:
            writer.write(ok())
            await writer.drain()

    async with RawServer(handler) as server:
        engine = await engine_for(server.url + "/prefix/v1", api_key="sk-engine")
        for _ in range(3):
            reply = await engine.chat({"model": "m", "messages": []}, session_id="r-1")
            assert reply.status == 200 and reply.prompt_span == b"1,2,3"
            assert reply.json is not None and reply.json["choices"][0]["token_ids"] == [5]
        version = await engine.request("POST", "/pause", params={"mode": "keep"})
        assert version.status == 200 and version.prompt_span is None and version.json["prompt_token_ids"] == [1, 2, 3]
    assert server.connections == 1, "one keep-alive connection served every call"
    head, body = server.requests[0].split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /prefix/v1/chat/completions HTTP/1.1"
    assert {"Authorization: Bearer sk-engine", "Content-Type: application/json", f"{SESSION_HEADER}: r-1",
            f"Content-Length: {len(body)}"} <= set(lines), lines
    assert any(line.startswith("Host: 127.0.0.1:") for line in lines)
    assert orjson.loads(body) == {"model": "m", "messages": []}
    assert server.requests[-1].startswith(b"POST /prefix/pause?mode=keep HTTP/1.1\r\n")
    assert b"Content-Length: 0\r\n" in server.requests[-1]


async def test_chunked_close_delimited_and_connection_close_replies(engine_for) -> None:
    async def handler(number, reader, writer):
        await server.read_request(reader)
        if number == 1:  # chunked, then the server says it will close
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                         + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (REPLY[:7], REPLY[7:])) + b"0\r\n\r\n")
        else:  # no length at all: the body ends with the connection
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + REPLY)
        await writer.drain()

    async with RawServer(handler) as server:
        engine = await engine_for(server.url)
        for _ in range(2):
            reply = await engine.chat({"messages": []}, session_id="s")
            assert reply.status == 200 and reply.body == REPLY and reply.prompt_span == b"1,2,3"
    assert server.connections == 2, "a connection the server closes is not reused"


async def test_error_statuses_are_replies_with_their_headers(engine_for) -> None:
    error = b'{"error":{"message":"slow down","type":"rate_limit","code":429}}'

    async def handler(number, reader, writer):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(error), error))
        await writer.drain()

    async with RawServer(handler) as server:
        reply = await (await engine_for(server.url)).chat({"messages": []}, session_id="s")
    assert reply.status == 429 and reply.headers["retry-after"] == "7"
    assert reply.json == orjson.loads(error) and reply.prompt_span is None


async def test_a_dropped_call_is_a_connect_failure_and_an_idle_timeout_is_retried(
    engine_for, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def handler(number, reader, writer):
        await server.read_request(reader)
        writer.write(ok())
        await writer.drain()
        await server.read_request(reader)  # the next call on this connection: dropped unanswered

    async with RawServer(handler) as server:
        engine = await engine_for(server.url)
        assert (await engine.chat({"messages": []}, session_id="s")).status == 200
        with pytest.raises(UpstreamFailure) as failure:
            await engine.chat({"messages": []}, session_id="s")
        assert failure.value.kind == "connect" and "before answering" in failure.value.message
        assert server.connections == 1, "a busy connection that drops the call is not retried"

        monkeypatch.setattr(h1_engine, "STALE_AFTER_IDLE_S", 0.0)  # as if it had idled a while
        assert (await engine.chat({"messages": []}, session_id="s")).status == 200  # new connection
        assert (await engine.chat({"messages": []}, session_id="s")).status == 200  # dropped, retried
    assert server.connections == 3 and len(server.requests) == 5


async def test_no_answer_malformed_answers_and_cut_replies_fail_clearly(engine_for) -> None:
    async def handler(number, reader, writer):
        await server.read_request(reader)
        if number == 1:
            await asyncio.sleep(5)  # never answers in time
        elif number == 2:
            writer.write(b"SMTP ready\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + REPLY[:10])
        await writer.drain()

    async with RawServer(handler) as server:
        url = server.url
        engine = await engine_for(url, timeout_s=0.3)
        for kind, words in (("timeout", "timed out after 0.3s"), ("protocol", "malformed HTTP"),
                            ("protocol", "in the middle of its reply")):
            with pytest.raises(UpstreamFailure) as failure:
                await engine.chat({"messages": []}, session_id="s")
            assert failure.value.kind == kind and words in failure.value.message

    with pytest.raises(UpstreamFailure) as failure:
        await (await engine_for(url)).chat({"messages": []}, session_id="s")  # server gone
    assert failure.value.kind == "connect" and "unreachable" in failure.value.message


async def test_bad_urls_and_header_values_are_refused() -> None:
    with pytest.raises(ValueError, match="http"):
        H1Engine("ftp://engine:21")
    engine = H1Engine("http://127.0.0.1:9")
    with pytest.raises(RuntimeError, match="start"):
        await engine.chat({}, session_id="s")
    await engine.start()
    with pytest.raises(ValueError, match="line breaks"):
        await engine.chat({}, session_id="s\r\nX-Evil: 1")


async def test_https_engines_are_verified_against_the_trust_store(
    engine_for, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datetime
    import ipaddress
    import ssl

    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "engine.test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "engine.pem", tmp_path / "engine.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert_path, key_path)

    async def handler(reader, writer):
        if await reader.readuntil(b"\r\n\r\n"):
            writer.write(ok())
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        untrusted = await engine_for(f"https://127.0.0.1:{port}")
        with pytest.raises(UpstreamFailure) as failure:
            await untrusted.chat({"messages": []}, session_id="s")
        assert failure.value.kind == "connect" and "CERTIFICATE_VERIFY_FAILED" in failure.value.message

        monkeypatch.setenv("SSL_CERT_FILE", str(cert_path))  # how a private CA is trusted
        trusted = await engine_for(f"https://127.0.0.1:{port}")
        reply = await trusted.chat({"messages": []}, session_id="s")
        assert reply.status == 200 and reply.prompt_span == b"1,2,3"
    finally:
        server.close()


@pytest.mark.parametrize("url", ["http://user:pw-secret@127.0.0.1:8000", "http://127.0.0.1:8000/v1?api_key=pw-secret",
                                 "http://:pw-secret@127.0.0.1:8000"])
def test_an_engine_url_with_credentials_is_refused_without_echoing_them(url: str) -> None:
    from openenv_harness.recorder.upstream.http import HTTPEngine

    for engine_class in (H1Engine, HTTPEngine):
        with pytest.raises(ValueError) as refused:
            engine_class(url)
        assert "engine_api_key" in str(refused.value) and "pw-secret" not in str(refused.value)


def test_an_engine_error_quoting_the_key_is_redacted() -> None:
    from openenv_harness.recorder.upstream.base import REDACTED_KEY, redact_key

    raw = b'{"error":{"message":"bad token: Bearer sk-123 (sk-123)"}}'
    assert redact_key(raw, "sk-123") == raw.replace(b"sk-123", REDACTED_KEY)
    assert redact_key(raw, None) is raw and redact_key(raw, "other") is raw


async def test_the_affinity_key_rides_on_every_session_call_and_can_be_renamed_or_off(engine_for) -> None:
    async def handler(number, reader, writer):
        while await server.read_request(reader) is not None:
            writer.write(ok())
            await writer.drain()

    async with RawServer(handler) as server:
        default = await engine_for(server.url)
        await default.chat({"messages": []}, session_id="s-1", affinity="t-abc")
        await default.post_for_session("/inference/v1/generate", {"token_ids": [1]}, session_id="s-1", affinity="t-abc")
        await default.request("POST", "/pause")  # engine control carries no session and no key
        renamed = await engine_for(server.url, affinity_header="X-Routing-Key")
        await renamed.chat({"messages": []}, session_id="s-2", affinity="t-def")
        off = await engine_for(server.url, affinity_header=None)
        await off.chat({"messages": []}, session_id="s-3", affinity="t-ghi")
    heads = [r.split(b"\r\n\r\n", 1)[0].decode().split("\r\n") for r in server.requests]
    assert "X-Session-ID: t-abc" in heads[0] and "X-Session-ID: t-abc" in heads[1]
    assert not any(line.startswith("X-Session-ID") for line in heads[2])
    assert "X-Routing-Key: t-def" in heads[3] and not any(line.startswith("X-Session-ID") for line in heads[3])
    assert not any("t-ghi" in line for line in heads[4]) and f"{SESSION_HEADER}: s-3" in heads[4]
    with pytest.raises(ValueError, match="header name"):
        H1Engine("http://127.0.0.1:9", affinity_header="Bad Header")
    engine = H1Engine("http://127.0.0.1:9")
    await engine.start()
    with pytest.raises(ValueError, match="line breaks"):
        await engine.chat({}, session_id="s", affinity="k\r\nX-Evil: 1")
