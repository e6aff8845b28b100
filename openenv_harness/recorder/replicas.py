"""The weight-sync fence over several engine replicas (behind a router).

Why the recorder does it: a router forwards ``POST /pause`` to one replica (vllm-router 0.1.17
picks one like any request), so pausing "the engine" through it leaves the others sampling with
the old weights while the trainer swaps them. The recorder's fence (``fence.py``) is one gate and
one policy version for every call, whichever replica serves it; this module makes the engine side
match: pause every replica, resume every replica.

- Replicas: the configured list (``RecorderConfig.engine_replicas``), plus, when asked
  (``engine_replicas_from_router``), the router's own worker list (vllm-router: ``GET
  /list_workers``), read at every pause so replicas added since are included.
- Pause is all or nothing: the replicas are paused concurrently; if any cannot pause, the ones that
  did are resumed (no version bump: nothing changed) and the error names the replica and its cause.
- Resume goes to every replica paused by the last pause; a replica that does not acknowledge keeps
  the fence closed (the caller's rule) and is named; a retry resumes again (idempotent on vLLM).
"""

from __future__ import annotations

import asyncio
from typing import Any

from openenv_harness.recorder.upstream.base import Upstream, UpstreamFailure
from openenv_harness.recorder.upstream.h1_engine import H1Engine
from openenv_harness.recorder.upstream.http import normalize_engine_url
from openenv_harness.recorder.upstream.sglang import engine_for

#: vllm-router's worker list route and the key holding the URLs
ROUTER_WORKERS = "/list_workers"


class ReplicaFenceError(Exception):
    """Some replicas failed a fence step: ``failed`` maps each one to its cause."""

    def __init__(self, step: str, failed: dict[str, str], done: list[str], undo_failed: dict[str, str]) -> None:
        self.step, self.failed, self.done, self.undo_failed = step, failed, done, undo_failed
        causes = "; ".join(f"{url}: {why}" for url, why in failed.items())
        message = f"engine {step} failed on {len(failed)} replica(s): {causes}"
        if step == "pause":
            message += f". Resumed the {len(done)} replica(s) that had paused; the fence stays open"
            if undo_failed:
                message += " -- but these did not resume: " + "; ".join(f"{u}: {w}" for u, w in undo_failed.items())
        else:
            message += f" ({len(done)} resumed). The fence stays closed: retry the resume"
        super().__init__(message)


class ReplicaFence:
    """Pauses and resumes every engine replica; one HTTP client per replica, made on first use."""

    def __init__(self, urls: list[str], *, router: Upstream | None = None, api_key: str | None = None,
                 timeout_s: float = 600.0, family: str = "vllm") -> None:
        #: the replicas' engine family: SGLang's pause and resume routes are reached through its adapter
        self.family = family
        self._configured = [normalize_engine_url(u) for u in urls]
        self._router = router
        self._api_key = api_key
        self._timeout_s = timeout_s
        self._clients: dict[str, Upstream] = {}
        #: the replicas the last successful pause paused (the ones a resume must reach)
        self.paused: list[str] = []

    async def replicas(self) -> list[str]:
        """The configured replicas and, if asked, the router's current workers (in that order, once each)."""
        found = list(self._configured)
        if self._router is not None:
            try:
                reply = await self._router.request("GET", ROUTER_WORKERS)
            except UpstreamFailure as exc:
                raise ReplicaFenceError("pause", {"router": f"worker list unreachable: {exc.message}"}, [], {}) from None
            urls = (reply.json or {}).get("urls") if reply.status == 200 else None
            if not isinstance(urls, list):
                raise ReplicaFenceError("pause", {"router": f"GET {ROUTER_WORKERS} answered HTTP {reply.status}: "
                                                  f"{reply.body[:200]!r} (not vllm-router?)"}, [], {})
            found += [normalize_engine_url(str(u)) for u in urls]
        return list(dict.fromkeys(found))

    async def _client(self, url: str) -> Upstream:
        client = self._clients.get(url)
        if client is None:
            transport = H1Engine(url, timeout_s=self._timeout_s, api_key=self._api_key, affinity_header=None)
            client = engine_for(self.family, transport)
            await client.start()
            self._clients[url] = client
        return client

    async def _post(self, url: str, path: str, params: dict[str, str] | None) -> dict[str, Any]:
        try:
            reply = await (await self._client(url)).request("POST", path, params=params)
        except UpstreamFailure as exc:
            raise RuntimeError(exc.message) from None
        if reply.status != 200:
            raise RuntimeError(f"HTTP {reply.status}: {reply.body[:200]!r}")
        return reply.json or {}

    async def _each(self, urls: list[str], path: str, params: dict[str, str] | None = None
                    ) -> tuple[dict[str, Any], dict[str, str]]:
        outcomes = await asyncio.gather(*(self._post(u, path, params) for u in urls), return_exceptions=True)
        done: dict[str, Any] = {}
        failed: dict[str, str] = {}
        for url, outcome in zip(urls, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                failed[url] = str(outcome) or type(outcome).__name__
            else:
                done[url] = outcome
        return done, failed

    async def pause(self, mode: str) -> dict[str, Any]:
        """Pause every replica, or none: on a failure the paused ones are resumed and it raises."""
        urls = await self.replicas()
        if not urls:
            raise ReplicaFenceError("pause", {"replicas": "none configured and the router listed none"}, [], {})
        done, failed = await self._each(urls, "/pause", {"mode": mode})
        if failed:
            _, undo_failed = await self._each(list(done), "/resume")
            raise ReplicaFenceError("pause", failed, list(done), undo_failed)
        self.paused = urls
        return {"replicas": done}

    async def resume(self) -> dict[str, Any]:
        """Resume every replica the last pause paused (all current ones if none is known)."""
        urls = self.paused or await self.replicas()
        done, failed = await self._each(urls, "/resume")
        if failed:
            self.paused = list(failed)  # a retry resumes the ones still paused
            raise ReplicaFenceError("resume", failed, list(done), {})
        self.paused = []
        return {"replicas": done}

    async def aclose(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.aclose()
