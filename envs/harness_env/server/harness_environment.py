"""The OpenEnv environment whose episodes are agent rollouts.

``reset`` chooses a task, places it in a fresh local sandbox, opens a recorder session and starts
the agent CLI against it -- the agent is running when ``reset`` returns. ``step(RunAgent)`` waits
for it, scores the final state with the task's verifier and returns the outcome with ``done=True``.
A second step is an error: the episode is over. ``close()`` kills the agent (and everything it
started), closes the recorder session and removes the sandbox.

Episodes are independent (own sandbox, own recorder session), so concurrent WebSocket sessions are
safe; OpenEnv runs each session's calls on its own thread.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

from openenv_harness.recorder.client import RecorderAPIError
from openenv_harness.rollout import HarnessSession
from openenv_harness.rollout.placement import NoRecorderAvailable

from .backend import HarnessBackend
from .errors import BackendError, BadRequestError, EpisodeError
from .summary import call_digests, trace_summary

try:
    from ..models import HarnessObservation, HarnessState, RecordsLocation, RunAgent
except ImportError:  # served as the top-level ``server`` package (uvicorn server.app:app)
    from models import HarnessObservation, HarnessState, RecordsLocation, RunAgent  # type: ignore[no-redef]

ENV_NAME = "harness_env"
_RESET_OPTIONS = ("task_id", "harness", "split", "index", "budgets")


class HarnessRolloutEnvironment(Environment[RunAgent, HarnessObservation, HarnessState]):
    """One agent rollout per episode; see the module docstring."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, *, backend: HarnessBackend) -> None:
        super().__init__()
        self._backend = backend
        self._session: HarnessSession | None = None
        self._base: HarnessObservation | None = None
        self._state = HarnessState(episode_id=None, step_count=0)
        self._lock = threading.Lock()  # close() may come from another thread than step()

    # -- reset ----------------------------------------------------------------------------------

    def reset(self, seed: int | None = None, episode_id: str | None = None, **options: Any) -> HarnessObservation:
        """Options: ``task_id``, or ``split`` + ``index``; ``harness`` (pi | opencode); ``budgets``
        (recorder caps such as ``max_agent_calls``). Without a task, the seed picks one."""
        unknown = sorted(set(options) - set(_RESET_OPTIONS))
        if unknown:
            raise BadRequestError(f"unknown reset option(s) {', '.join(unknown)}; accepted: seed, episode_id, "
                             + ", ".join(_RESET_OPTIONS))
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
            raise BadRequestError(f"seed must be a non-negative integer, got {seed!r}")
        if episode_id is not None and (not isinstance(episode_id, str) or not episode_id):
            raise BadRequestError(f"episode_id must be a non-empty string, got {episode_id!r}")
        backend = self._backend
        backend.start()  # no-op when the app's startup already did it
        task = backend.tasks.resolve(task_id=_opt_str(options, "task_id"), split=_opt_str(options, "split"),
                                     index=_opt_int(options, "index"), seed=seed)
        budgets_arg = options.get("budgets")
        if budgets_arg is not None and not isinstance(budgets_arg, dict):
            raise BadRequestError(f"budgets must be an object of recorder caps, got {type(budgets_arg).__name__}")
        budgets = backend.budgets(budgets_arg)
        preset = backend.preset(_opt_str(options, "harness"))  # last: the client's own errors come first
        self._end_episode()  # only now: a refused reset leaves the running episode alone
        self._state = HarnessState(episode_id=None, step_count=0)
        episode_id = episode_id or uuid.uuid4().hex
        factory = backend.session_factory(preset, task, budgets, metadata={"env": ENV_NAME})
        try:
            session = factory.create(task.id, seed=seed, episode_id=episode_id)
        except NoRecorderAvailable as exc:  # every recorder is down: 503 with each one's cause
            raise BackendError(str(exc)) from None
        base = HarnessObservation(
            task_id=task.id,
            harness=preset.name,
            instruction=task.instruction,
            session_id=session.session_id,
            records=RecordsLocation(**backend.records_paths(session.session_id, session.client.base_url)),
        )
        with self._lock:
            self._session = session
            self._base = base
            self._state = HarnessState(episode_id=episode_id, step_count=0, task_id=task.id, harness=preset.name,
                                       session_id=session.session_id, phase="running")
        return base.model_copy(update={"done": False, "reward": None})

    # -- step -----------------------------------------------------------------------------------

    def step(self, action: RunAgent, timeout_s: float | None = None, **kwargs: Any) -> HarnessObservation:
        if not isinstance(action, RunAgent):
            raise TypeError(f"this environment takes RunAgent actions, got {type(action).__name__}")
        with self._lock:
            session, base = self._session, self._base
        if session is None or base is None:
            if self._state.phase == "done":
                raise EpisodeError(f"episode {self._state.episode_id} is done; call reset() to start another")
            raise EpisodeError("no episode is running: call reset() first")
        limit = action.timeout_s or timeout_s or self._backend.config.default_step_timeout_s
        observation: HarnessObservation | None = None
        try:
            observation = self._finish(session, base, limit)
        finally:
            self._end_episode()
            self._state = self._state.model_copy(update={
                "step_count": self._state.step_count + 1, "phase": "done",
                "reward": observation.reward if observation is not None else None,
            })
        return observation

    def _finish(self, session: HarnessSession, base: HarnessObservation, limit: float) -> HarnessObservation:
        """Wait for the agent, score its work, condense its records."""
        timed_out = False
        exit_code: int | None = None
        try:
            exit_code = session.wait_for_completion(limit)
        except TimeoutError:
            timed_out = True
        verified = session.verify([])
        result = session.agent.result()
        error = result.error
        trace = None
        digests: list[dict[str, Any]] = []
        try:
            info = session.client.session(session.session_id)
            records = session.client.records(session.session_id)
            trace = trace_summary(records, info)
            digests = call_digests(records)
            if info.get("last_error") and not error:
                error = (info["last_error"] or {}).get("message")
        except (RecorderAPIError, OSError) as exc:
            error = error or f"could not read the rollout's records: {exc}"
        except httpx.TransportError as exc:  # its recorder is down: this episode fails, the others go on
            unreachable = (f"recorder {session.client.base_url} holding session {session.session_id} is "
                           f"unreachable ({type(exc).__name__}: {exc}); its records could not be read")
            error = unreachable + (f"; the agent: {error}" if error else "")
        return base.model_copy(update={
            "done": True,
            "reward": verified.env_reward,
            "exit_code": exit_code,
            "agent_ok": result.ok,
            "timed_out": timed_out,
            "final_answer": result.final_answer,
            "error": error,
            "verify_output": str(verified.artifacts.get("verify_output") or "")[-2000:],
            "trace": trace,
            "wall_s": round(time.time() - session.agent.started_at, 2),
            "metadata": {"calls": digests, "verify": {k: v for k, v in verified.metrics.items()
                                                      if isinstance(v, (int, float, str, bool)) or v is None}},
        })

    # -- state, close, metadata -----------------------------------------------------------------

    @property
    def state(self) -> HarnessState:
        return self._state

    def _end_episode(self) -> None:
        with self._lock:
            session, self._session, self._base = self._session, None, None
        if session is not None:
            session.close()

    def close(self) -> None:
        """Kill the agent (if still running), close its recorder session, remove its sandbox."""
        self._end_episode()

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=ENV_NAME,
            description=(
                "Episodes are rollouts of unmodified coding agents (Pi, OpenCode) on tasks with verifiers; "
                "every model call is recorded with exact token ids and logprobs. reset(task_id=..., harness=...) "
                "starts the agent, step(RunAgent()) returns its reward and where its records are."
            ),
            version="0.1.0",
            readme_content=_readme(),
        )

    # -- OpenEnv Task API (discovery) -----------------------------------------------------------

    def list_splits(self) -> list[dict[str, str]]:
        return self._backend.tasks.list_splits()

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return self._backend.tasks.list_tasks(split)

    def num_tasks(self, split: str) -> int:
        return len(self._backend.tasks.list_tasks(split))

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        return self._backend.tasks.spec(self._backend.tasks.at(split, index))

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict[str, Any]]:
        return self._backend.tasks.get_task_range(split, start, stop)


def _readme() -> str | None:
    """The environment's README (packaged next to ``models.py``), shown by OpenEnv's web interface."""
    try:
        return (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    except OSError:
        return None


def _opt_str(options: dict[str, Any], name: str) -> str | None:
    value = options.get(name)
    if value is not None and not isinstance(value, str):
        raise BadRequestError(f"{name} must be a string, got {type(value).__name__}")
    return value


def _opt_int(options: dict[str, Any], name: str) -> int | None:
    value = options.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise BadRequestError(f"{name} must be an integer, got {type(value).__name__}")
    return value
