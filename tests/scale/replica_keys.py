"""Affinity keys the real router sends to each replica: found by asking the router, not by hashing here."""

from __future__ import annotations

import httpx

from openenv_harness.engine.router import VLLMRouter
from openenv_harness.testing.engine import EngineServer


def key_for_each(router: VLLMRouter, replicas: list[EngineServer]) -> list[str]:
    """One affinity key the router sends to each replica (found by asking it, not by hashing here)."""
    found: dict[int, str] = {}
    for n in range(200):
        key = f"probe-{n}"
        httpx.post(router.url + "/v1/chat/completions", headers={"X-Session-ID": key}, timeout=30,
                   json={"model": "reference-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        for index, engine in enumerate(replicas):
            if any(e["headers"].get("x-session-id") == key for e in engine.requests()):
                found.setdefault(index, key)
        if len(found) == len(replicas):
            for engine in replicas:
                engine.reset()
            return [found[i] for i in range(len(replicas))]
    raise AssertionError(f"the router sent 200 keys to replicas {sorted(found)} only")
