"""The interface of a way to sample from exact prompt ids (``id_sampling.py`` has the engine's two)."""

from __future__ import annotations

from typing import Any, Protocol

from openenv_harness.recorder.upstream.base import Upstream, UpstreamReply


class IdSampler(Protocol):
    """One way to sample from exact ids; the reply's JSON is in ``/inference/v1/generate``'s shape."""

    route: str

    async def sample(self, upstream: Upstream, prompt: list[int], params: dict[str, Any], *, model: str | None,
                     session_id: str, affinity: str | None,
                     output: dict[str, Any] | None = None) -> UpstreamReply: ...
