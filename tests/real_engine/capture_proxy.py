"""A transparent HTTP hop between the recorder and the real vLLM that keeps every raw reply.

Why: the real-engine tests must compare what the recorder stored with what vLLM *actually sent*,
byte for byte, not with a second call (a small model on a CPU is not bit-stable across batches).
It forwards method, path, query, headers and body unchanged and hands back the engine's status,
headers and body unchanged; it is test scaffolding, not a double: the engine behind it is real.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from openenv_harness.recorder.serving import ThreadedServer

_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


@dataclass
class Exchange:
    method: str
    path: str
    request: bytes
    status: int
    reply: bytes

    def request_json(self) -> Any:
        return orjson.loads(self.request) if self.request else None

    def reply_json(self) -> Any:
        return orjson.loads(self.reply)


@dataclass
class CaptureProxy:
    upstream: str
    hidden: frozenset[str] = frozenset()
    exchanges: list[Exchange] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadedServer | None = None

    def _app(self) -> Starlette:
        client = httpx.AsyncClient(base_url=self.upstream, timeout=600)

        async def forward(request: Request) -> Response:
            body = await request.body()
            if request.url.path in self.hidden:
                refusal = orjson.dumps({"detail": "Not Found"})
                with self._lock:
                    self.exchanges.append(Exchange(request.method, request.url.path, body, 404, refusal))
                return Response(refusal, status_code=404, media_type="application/json")
            headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
            reply = await client.request(request.method, request.url.path, params=request.query_params,
                                         content=body, headers=headers)
            with self._lock:
                self.exchanges.append(Exchange(request.method, request.url.path, body, reply.status_code, reply.content))
            out_headers = {k: v for k, v in reply.headers.items() if k.lower() not in _HOP | {"content-encoding"}}
            return Response(reply.content, status_code=reply.status_code, headers=out_headers)

        return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "PUT", "DELETE"])])

    @property
    def url(self) -> str:
        assert self._server is not None
        return self._server.url

    def start(self) -> "CaptureProxy":
        self._server = ThreadedServer(self._app()).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()

    def chat_exchanges(self) -> list[Exchange]:
        return self.exchanges_on("/v1/chat/completions")

    def sampled_chat_exchanges(self) -> list[Exchange]:
        """The chat calls the recorder forwarded for an agent and the engine answered: each asks for its
        ids (``return_token_ids``, a capture field). The recorder's own probes of the engine ask for none:
        its logprobs-mode measurement runs again at a session's creation once what it knows of the engine
        is older than ``template_reprobe_s``, so a run of rollouts longer than that sees it mid-run."""
        return [e for e in self.chat_exchanges()
                if e.status == 200 and (e.request_json() or {}).get("return_token_ids") is True]

    def exchanges_on(self, path: str) -> list[Exchange]:
        with self._lock:
            return [e for e in self.exchanges if e.path == path]

    def clear(self) -> None:
        with self._lock:
            self.exchanges.clear()
