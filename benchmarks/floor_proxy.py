"""A baseline, not a product: the least work any recording proxy in Python must do per call.

Why it exists: the recorder's latency target at one session (added p50 ≤ 1 ms at 8k prompts) sits
near what a proxy hop costs on this machine at all. Measuring that cost, in the same run, says how
much of the recorder's added latency is the hop and how much is the recorder's own bookkeeping.

Per call it does only what cannot be skipped when recording token evidence faithfully:
- read the agent's request with httptools (the parser uvicorn uses) and parse its JSON;
- forward it with the recorder's own engine client (``H1Engine``), adding the capture fields;
- read the prompt ids with the recorder's ``PromptIdsReader`` and the rest of the evidence with
  ``extract_evidence``;
- append one frame (request bytes, reply head, ids) to a file with one ``writev`` -- the recorder's
  journal write at its default durability (no fsync);
- answer the agent with the reply minus the engine-only fields.

It has no authentication, sessions beyond a key, budgets, dedupe, provenance, metrics, fidelity
classification, SQLite index, streaming, error relay or request size limits. Sessions follow the
OpenEnv capture wire (``POST /sessions``, the id as API key), so the load generator drives it as it
drives capture.

    python benchmarks/floor_proxy.py --engine-url http://127.0.0.1:8000 --port 8100 --journal /tmp/floor.log
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import struct
from array import array
from collections import OrderedDict
from typing import Any

import httptools
import orjson
import uvloop

from openenv_harness.recorder.call.forward import upstream_body
from openenv_harness.recorder.upstream.h1_engine import H1Engine
from openenv_harness.recorder.upstream.reply_parse import PromptIdsReader
from openenv_harness.recorder.validate import agent_view, extract_evidence

#: Id readers kept, least recently used dropped first: capture-style sessions are never closed, and
#: a 64-session run starts thousands of conversations (the recorder drops a reader at session close).
KEEP_READERS = 256

#: A frame: three little-endian lengths (head JSON, request body, prompt ids), then those bytes.
_FRAME = struct.Struct("<III")


class FloorProxy:
    """The per-call work, apart from HTTP serving."""

    def __init__(self, engine: H1Engine, journal_fd: int) -> None:
        self.engine = engine
        self.fd = journal_fd
        self.readers: OrderedDict[bytes, PromptIdsReader] = OrderedDict()
        self.numbers = itertools.count(1)

    async def handle(self, method: bytes, path: bytes, key: bytes, body: bytes) -> tuple[int, bytes]:
        if method == b"GET" and path == b"/health":
            return 200, b'{"status":"ok"}'
        if method == b"POST" and path == b"/sessions":
            return 200, orjson.dumps({"session_id": f"floor-{next(self.numbers)}", "capture_level": "tokens"})
        if method != b"POST" or path != b"/v1/chat/completions":
            return 404, b'{"error":{"message":"no such route"}}'
        request = orjson.loads(body)
        if request.get("stream"):
            return 400, b'{"error":{"message":"the floor proxy does not stream"}}'
        reply = await self.engine.chat(upstream_body(request), session_id="floor")  # the recorder's own body
        if reply.status != 200 or reply.json is None:
            return 502, reply.body
        ids = self._reader(key).take(reply)
        if reply.json is None:
            return 502, reply.body
        evidence = extract_evidence(reply.json, ids)
        head = orjson.dumps({"key": key.decode("latin-1"), "valid": evidence.valid, "reply": reply.json})
        ids = evidence.prompt_ids if evidence.prompt_ids is not None else array("I")
        os.writev(self.fd, [_FRAME.pack(len(head), len(body), len(ids) * ids.itemsize), head, body, ids])
        return 200, orjson.dumps(agent_view(reply.json, keep_logprobs=request.get("logprobs") is True))

    def _reader(self, key: bytes) -> PromptIdsReader:
        reader = self.readers.get(key)
        if reader is None:
            reader = self.readers[key] = PromptIdsReader()
            if len(self.readers) > KEEP_READERS:
                self.readers.popitem(last=False)
        else:
            self.readers.move_to_end(key)
        return reader


def read_frames(path: str) -> list[tuple[dict[str, Any], bytes, array]]:
    """Every frame of a floor journal: (head, request body, prompt ids)."""
    data, out, offset = open(path, "rb").read(), [], 0
    while offset < len(data):
        n_head, n_body, n_ids = _FRAME.unpack_from(data, offset)
        offset += _FRAME.size
        head = orjson.loads(data[offset : offset + n_head])
        body = data[offset + n_head : offset + n_head + n_body]
        ids = array("I")
        ids.frombytes(data[offset + n_head + n_body : offset + n_head + n_body + n_ids])
        out.append((head, body, ids))
        offset += n_head + n_body + n_ids
    return out


class _Connection(asyncio.Protocol):
    """HTTP/1.1 with keep-alive, one request at a time (the load generator does not pipeline)."""

    def __init__(self, proxy: FloorProxy) -> None:
        self.proxy = proxy
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.key = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"authorization":
            self.key = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        method, body = self.parser.get_method(), b"".join(self.body)
        keep_alive = self.parser.should_keep_alive()
        self.body = []
        asyncio.ensure_future(self._answer(method, self.url, self.key, body, keep_alive))

    async def _answer(self, method: bytes, url: bytes, key: bytes, body: bytes, keep_alive: bool) -> None:
        try:
            status, out = await self.proxy.handle(method, url.split(b"?", 1)[0], key, body)
        except Exception as exc:  # noqa: BLE001 -- a baseline: say what broke and go on
            status, out = 500, orjson.dumps({"error": {"message": f"{type(exc).__name__}: {exc}"}})
        assert self.transport is not None
        if self.transport.is_closing():
            return
        self.transport.write(b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (status, len(out), out))
        if not keep_alive:
            self.transport.close()


async def serve(engine_url: str, host: str, port: int, journal: str) -> None:
    engine = H1Engine(engine_url)
    await engine.start()
    fd = os.open(journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
    proxy = FloorProxy(engine, fd)
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, lambda: stop.done() or stop.set_result(None))
    server = await loop.create_server(lambda: _Connection(proxy), host, port)
    try:
        await stop
    finally:
        server.close()
        await engine.aclose()
        os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine-url", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--journal", required=True, help="file the call frames are appended to")
    a = p.parse_args()
    uvloop.run(serve(a.engine_url, a.host, a.port, a.journal))


if __name__ == "__main__":
    main()
