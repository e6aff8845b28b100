"""A test double of an engine that answers each chat call with the exact bytes registered for it.

Why not the reference engine: a reply corpus needs replies no real engine would write on purpose --
duplicated keys, keys spelled with escapes, a truncated body -- byte for byte as given, which a
JSON-serializing server cannot produce. The call's last message names its reply. Everything else
(``/version``, unknown routes) is a 404, as on an engine without them. Loopback HTTP/1.1 with
keep-alive, on its own thread and event loop.
"""

from __future__ import annotations

import asyncio
import threading

import orjson


class CannedEngine:
    def __init__(self) -> None:
        self.replies: dict[str, tuple[int, bytes]] = {}
        self.served = 0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add(self, key: str, body: bytes, status: int = 200) -> None:
        self.replies[key] = (status, body)

    def start(self) -> "CannedEngine":
        ready = threading.Event()

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            self._server = loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="canned-engine", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        async def shut() -> None:
            server.close()
            await server.wait_closed()

        asyncio.run_coroutine_threadsafe(shut(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> "CannedEngine":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                status, reply = 404, b'{"error":{"message":"not served by the canned engine","code":404}}'
                if method == "POST" and path.endswith("/v1/chat/completions"):
                    key = orjson.loads(body)["messages"][-1]["content"]
                    status, reply = self.replies.get(key, (404, b'{"error":{"message":"no reply for this call"}}'))
                    self.served += 1
                reason = b"OK" if status == 200 else b"Error"
                writer.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                             % (status, reason, len(reply)) + reply)
                await writer.drain()
        finally:
            writer.close()
