"""``HFEmulator``: a local stand-in for the HF Jobs API and its in-job sandbox servers.

Why: ``huggingface_hub.Sandbox`` is tested here against the real client code, with nothing
faked on the client side -- only the far end. One asyncio server on an ephemeral port serves both
the Jobs API (``/api/...``) and every job's sandbox server (``/_job/<id>--49983.emu/...``); it runs
on its own event loop in a daemon thread, so the synchronous client can be driven from a test.
Commands run as local processes (``/bin/sh -c``) in a per-sandbox home under ``root``.

With ``tls`` (a server ``ssl.SSLContext``) it serves HTTPS and WSS, as huggingface.co and the jobs
proxy do, so the clients' certificate checks run too; without it, plain HTTP.

Not modelled: Landlock (pooled sandboxes *can* bind TCP here), uids, rlimits, idle timeouts,
cold starts, the Jobs proxy's own timeouts.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import ssl
import tempfile
import threading
from pathlib import Path

from openenv_harness.testing.hf_emulator.jobs import JOB_PREFIX, JOB_SUFFIX, EmulatedJob, JobsApi
from openenv_harness.testing.hf_emulator.sandbox_server import KEEP_ALIVE, SandboxServer
from openenv_harness.testing.hf_emulator.wire import HEAD_LIMIT, HttpFailure, Request, error_response, read_request


class HFEmulator:
    """The fake HF endpoint. Use as a context manager, or ``start()`` / ``stop()``."""

    def __init__(
        self,
        *,
        token: str | None = None,
        user: str = "emu-user",
        root: Path | None = None,
        exec_ping_interval_s: float = 15.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        #: The only HF bearer the emulator accepts.
        self.token = token or f"hf_emu_{secrets.token_hex(12)}"
        self.user = user
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="hf-emulator-")) if root is None else root
        self._exec_ping_interval_s = exec_ping_interval_s
        #: the server side of TLS (None: plain HTTP)
        self.tls = tls
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self._jobs_api: JobsApi | None = None
        self._sandboxes = SandboxServer(hf_token=self.token, exec_ping_interval_s=exec_ping_interval_s)
        self.port = 0

    @property
    def url(self) -> str:
        """The value for ``HF_ENDPOINT``."""
        return f"{'https' if self.tls is not None else 'http'}://127.0.0.1:{self.port}"

    @property
    def jobs(self) -> dict[str, EmulatedJob]:
        return {} if self._jobs_api is None else self._jobs_api.jobs

    def job(self, job_id: str) -> EmulatedJob:
        return self.jobs[job_id]

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> HFEmulator:
        if self._thread is not None:
            return self
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="hf-emulator", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), loop).result(timeout=10)
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve_connection, "127.0.0.1", 0, limit=HEAD_LIMIT,
                                                  ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        self._jobs_api = JobsApi(user=self.user, user_id="u" + secrets.token_hex(8), root=self.root, base_url=self.url)

    def stop(self) -> None:
        """Kill every process of every job, close all connections, stop the thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=15)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=15)
            if not thread.is_alive():
                loop.close()
            self._loop = self._thread = None
            if self._own_root:
                shutil.rmtree(self.root, ignore_errors=True)

    async def _shutdown(self) -> None:
        for job in self.jobs.values():
            job.stop("COMPLETED" if job.stage == "RUNNING" else job.stage)
        if self._server is not None:
            self._server.close()
        for writer in list(self._connections):
            writer.transport.abort()
        await asyncio.sleep(0.05)  # let the reaper tasks observe the killed processes

    def __enter__(self) -> HFEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving --------------------------------------------------------------------------------

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            while True:
                try:
                    request = await read_request(reader, writer)
                except HttpFailure as failure:
                    writer.write(error_response(failure.status, failure.message, close=True))
                    await writer.drain()
                    return
                if request is None:
                    return
                try:
                    reply = await self._route(request)
                except HttpFailure as failure:
                    # The body may be unread: answer, then close rather than misparse the rest.
                    writer.write(error_response(failure.status, failure.message, close=True))
                    await writer.drain()
                    return
                if reply is None:
                    return
                if reply is not KEEP_ALIVE:
                    writer.write(reply)
                    await writer.drain()
                if not request.keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            self._connections.discard(writer)
            writer.transport.abort()

    async def _route(self, request: Request) -> bytes | None:
        assert self._jobs_api is not None
        path = request.path
        if path.startswith("/api/"):
            bearer = request.header("authorization") or ""
            if bearer != f"Bearer {self.token}":
                raise HttpFailure(401, "invalid user token")
            return await self._jobs_api.handle(request)
        if path.startswith(JOB_PREFIX):
            host, _, rest = path[len(JOB_PREFIX):].partition("/")
            job = self.jobs.get(host.removesuffix(JOB_SUFFIX)) if host.endswith(JOB_SUFFIX) else None
            if job is None:
                raise HttpFailure(404, "no such job host")
            return await self._sandboxes.handle(job, request, "/" + rest)
        raise HttpFailure(404, f"no route {request.method} {path}")
