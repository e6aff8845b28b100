"""What every episode of one server shares: the recorder (and engine), the tasks, the defaults.

One backend per server process, created with the app and started at its startup, passed to each
environment instance explicitly (OpenEnv builds one instance per WebSocket session, and more for
its stateless HTTP routes, so instances must be cheap and must not start anything themselves).

In the embedded and engine deployments the backend owns a ``LocalStack`` -- the recorder, and in
the embedded case the reference engine, on loopback threads of this process. With an external
recorder it owns nothing and only knows the URLs and the admin token. Several external recorders
share one ``RecorderPool`` (``openenv_harness/rollout/placement.py``): each episode is placed on
the one with the fewest live sessions, a recorder that does not answer is skipped, and the
episode's session -- and so its records -- stays on the recorder that created it.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from pathlib import Path
from typing import Any

from openenv_harness.cli.stack import LocalStack
from openenv_harness.harnesses.base import HarnessPreset
from openenv_harness.harnesses.install import PREFIX_ENV, binary_path, default_node_prefix
from openenv_harness.harnesses.registry import UnknownHarnessError, get_preset
from openenv_harness.recorder.session.spec import Budgets
from openenv_harness.rollout import HarnessSessionFactory, Task
from openenv_harness.rollout.placement import RecorderPool

from .config import ENV_VARS, EnvServerConfig, url_list
from .errors import BackendError, BadRequestError
from .tasks import TaskSet

log = logging.getLogger("harness_env")

#: Where this server exposes the admin routes of a recorder it owns.
PROXY_PREFIX = "/recorder"


class HarnessBackend:
    """The recorder side of one environment server; ``start()``/``stop()`` are idempotent."""

    def __init__(self, config: EnvServerConfig, tasks: TaskSet) -> None:
        self.config = config
        self.tasks = tasks
        self._lock = threading.Lock()
        self._stack: LocalStack | None = None
        self._recorder_url: str | None = None
        self._admin_token: str | None = None
        self._pool: RecorderPool | None = None
        self.store_path: str | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._recorder_url is not None

    def start(self) -> None:
        with self._lock:
            if self._recorder_url is not None:
                return
            if self.config.recorder_url:
                urls = self.config.recorder_urls
                assert self.config.admin_token is not None  # the config requires it with an external recorder
                agents = self.config.agent_recorder_url
                self._pool = RecorderPool(urls, self.config.admin_token, agent_urls=url_list(
                    agents, ENV_VARS["agent_recorder_url"]) if agents else None)
                self._recorder_url = urls[0]
                self._admin_token = self.config.admin_token
                log.info("harness_env: external recorder(s) at %s", ", ".join(urls))
                return
            data_dir = Path(self.config.data_dir) if self.config.data_dir else Path(
                tempfile.mkdtemp(prefix="harness-env-"))
            data_dir.mkdir(parents=True, exist_ok=True)
            self.store_path = str(data_dir / "records.db")
            # the trainer reads records with the token it configured; LocalStack mints one otherwise
            stack = LocalStack(engine_url=self.config.engine_url, store_path=self.store_path,
                               model=self.config.model, tasks=self.tasks.all(), admin_token=self.config.admin_token)
            levels = _uvicorn_log_levels()
            try:
                stack.__enter__()
            except BaseException:
                stack.__exit__(None, None, None)  # whatever did start (the engine) must not outlive us
                raise
            finally:
                _restore_log_levels(levels)
            assert stack.recorder is not None
            self._stack = stack
            self._admin_token = stack.admin_token
            self._recorder_url = stack.recorder.url
            log.info("harness_env: %s mode, recorder at %s, records in %s", self.config.mode,
                     self._recorder_url, self.store_path)
            if not self.config.admin_token:
                log.warning("harness_env: OEH_ADMIN_TOKEN is not set, so records cannot be read through "
                            "%s/admin (the recorder's admin token was generated and is not shown)", PROXY_PREFIX)

    def stop(self) -> None:
        with self._lock:
            stack, self._stack = self._stack, None
            self._recorder_url = None
            self._admin_token = None
            self._pool = None
        if stack is not None:
            stack.__exit__(None, None, None)
            log.info("harness_env: recorder stopped")

    # -- what episodes need -----------------------------------------------------------------------

    @property
    def owns_recorder(self) -> bool:
        return self._stack is not None

    @property
    def recorder_url(self) -> str:
        """The recorder as this server reaches it (loopback when it runs here; the first of several)."""
        if self._recorder_url is None:
            raise BackendError("the environment server's backend is not started")
        return self._recorder_url

    @property
    def admin_token(self) -> str:
        if self._admin_token is None:
            raise BackendError("the environment server's backend is not started")
        return self._admin_token

    @property
    def agent_recorder_url(self) -> str:
        return (self.config.agent_recorder_url or self.recorder_url).rstrip("/")

    def model_for(self, task: Task, harness: str | None = None) -> str:
        if self._stack is not None:
            return self._stack.model_for(task, harness)
        assert self.config.model is not None  # the config requires it with an external recorder
        return self.config.model

    def preset(self, name: str | None) -> HarnessPreset:
        """The agent CLI for an episode; a clear error when it is unknown or not installed."""
        try:
            preset = get_preset(name or self.config.harness)
        except UnknownHarnessError as exc:
            raise BadRequestError(str(exc)) from None
        binary = binary_path(preset)
        if not binary.exists():
            raise BackendError(
                f"the {preset.name} CLI is not installed at {binary}: run "
                f"`python -m openenv_harness.harnesses.install {preset.name}` "
                f"({PREFIX_ENV}={default_node_prefix()})"
            )
        return preset

    def budgets(self, overrides: dict[str, Any] | None) -> dict[str, Any]:
        """The server's budgets with an episode's overrides, checked against the recorder's schema."""
        merged = {**self.config.budgets(), **(overrides or {})}
        try:
            return Budgets.model_validate(merged).model_dump(exclude_none=True)
        except ValueError as exc:
            raise BadRequestError(f"invalid budgets {overrides!r}: {exc}") from None

    def session_factory(self, preset: HarnessPreset, task: Task, budgets: dict[str, Any],
                        metadata: dict[str, Any]) -> HarnessSessionFactory:
        pool = self._pool
        return HarnessSessionFactory(
            harness=preset,
            recorder_url=[slot.url for slot in pool.slots] if pool is not None else self.recorder_url,
            agent_recorder_url=None if pool is not None else self.agent_recorder_url,
            pool=pool,
            admin_token=self.admin_token,
            model=self.model_for(task, preset.name),
            tasks={task.id: task},
            budgets=budgets,
            metadata=metadata,
            context_window=self.config.context_window,
            max_output_tokens=self.config.max_output_tokens,
        )

    def public_url(self, recorder_url: str) -> str:
        """How observations name a recorder: its ``OEH_RECORDER_PUBLIC_URL`` entry, else its URL."""
        recorder_url = recorder_url.rstrip("/")
        if not self.config.recorder_public_url:
            return recorder_url
        public = url_list(self.config.recorder_public_url, ENV_VARS["recorder_public_url"])
        ours = [slot.url for slot in self._pool.slots] if self._pool is not None else [self.recorder_url]
        return public[ours.index(recorder_url)] if recorder_url in ours else recorder_url

    def records_paths(self, session_id: str, recorder_url: str | None = None) -> dict[str, Any]:
        """Where a session's records are, for ``RecordsLocation``: on ``recorder_url``, the recorder
        that holds the session (the only one when this server has one)."""
        records = f"/admin/sessions/{session_id}/records"
        return {
            "session_id": session_id,
            "recorder_url": self.public_url(recorder_url or self.recorder_url),
            "records_path": records,
            "training_trace_path": f"/admin/sessions/{session_id}/training_trace",
            "proxy_path": PROXY_PREFIX + records if self.owns_recorder else None,
        }


def _uvicorn_log_levels() -> dict[str, int]:
    return {name: logging.getLogger(name).level for name in ("uvicorn", "uvicorn.error", "uvicorn.access")}


def _restore_log_levels(levels: dict[str, int]) -> None:
    """Starting the in-process recorder and engine reconfigures uvicorn's (process-wide) loggers to
    their quieter level; the server's own startup and request lines must keep theirs."""
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
