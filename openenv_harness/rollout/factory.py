"""Session factories: one call per rollout, shaped the way trainers call them.

``HarnessSessionFactory`` is an OpenEnv ``ResourceSessionFactory``: ``create(task, seed, episode_id)``
places the task in a fresh sandbox, creates the recorder session (budgets, metadata, config hashes),
launches the agent and returns a ``HarnessSession``.

``TRLSessionFactory`` is what TRL 1.16's ``HarnessRolloutWorker`` takes as
``harness_session_factory``: a picklable callable (the worker runs in a child process) that is
called with ``sampling=`` -- the trainer's training sampling -- and returns the factory. That
sampling is pinned on every upstream call of the session and recorded in provenance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from openenv.core.harness import ResourceSessionFactory

from openenv_harness.harnesses.base import HarnessOptions, HarnessPreset
from openenv_harness.harnesses.registry import get_preset
from openenv_harness.recorder.client import RecorderClient
from openenv_harness.rollout.launch import launch_agent
from openenv_harness.rollout.placement import RecorderPool, as_list
from openenv_harness.rollout.session import HarnessSession
from openenv_harness.rollout.tasks import Task, task_from
from openenv_harness.rollout.taskset import BUILTIN_TASKS
from openenv_harness.sandbox.base import Sandbox


def _local_sandbox() -> Sandbox:
    from openenv_harness.sandbox.local import LocalSandbox

    return LocalSandbox()


def _default_executable(preset: HarnessPreset) -> str:
    from openenv_harness.harnesses.install import binary_path

    return str(binary_path(preset))


#: The context window an agent is told when the engine does not say its own.
FALLBACK_CONTEXT_WINDOW = 32768


def engine_context_window(client: RecorderClient, upstream: str | None = None) -> int:
    """The engine's ``max_model_len`` as the recorder read it from ``/v1/models``: an agent told a
    larger window than the engine serves sends prompts the engine refuses."""
    if upstream not in (None, "default"):
        return FALLBACK_CONTEXT_WINDOW
    length = (client.health().get("engine") or {}).get("max_model_len")
    return length if isinstance(length, int) and length > 0 else FALLBACK_CONTEXT_WINDOW


class HarnessSessionFactory(ResourceSessionFactory):
    """Creates one ``HarnessSession`` per rollout.

    ``recorder_url`` may list several recorders (``agent_recorder_url`` then lists how agents reach
    each, in the same order): each session goes to the one with the fewest live sessions, and its
    trace is read from there (``placement.py``)."""

    def __init__(
        self,
        *,
        harness: str | HarnessPreset,
        recorder_url: str | list[str],
        admin_token: str,
        model: str,
        tasks: dict[str, Task] | None = None,
        sandbox_factory: Callable[[], Sandbox] | None = None,
        executable: str | None = None,
        options: HarnessOptions | None = None,
        budgets: dict[str, Any] | None = None,
        sampling: dict[str, Any] | None = None,
        training_temperature: float | None = None,
        metadata: dict[str, Any] | None = None,
        context_window: int | None = None,
        max_output_tokens: int = 4096,
        agent_recorder_url: str | list[str] | None = None,
        trainer_template_fingerprint: str | None = None,
        upstream: str | None = None,
        wait_timeout_s: float | None = None,
        prompt_mode: str = "full_history",
        prompt_mode_strict: bool = False,
        pool: RecorderPool | None = None,
        require_exact_template: bool = False,
    ) -> None:
        self.preset = get_preset(harness) if isinstance(harness, str) else harness
        #: the recorders sessions are placed on (least live sessions first); ``pool`` shares one
        #: across factories (a server making a factory per episode), so placements under way count
        self.pool = pool or RecorderPool(recorder_url, admin_token, agent_urls=agent_recorder_url)
        self.recorder_urls = as_list(recorder_url)
        self.recorder_url = self.recorder_urls[0]
        #: how the agent reaches the (first) recorder (differs when the recorder is published via a tunnel)
        self.agent_recorder_url = self.pool.slots[0].agent_url
        self.admin_token = admin_token
        self.model = model
        self.tasks = dict(BUILTIN_TASKS if tasks is None else tasks)
        self.sandbox_factory = sandbox_factory or _local_sandbox
        self.executable = executable
        self.options = options or HarnessOptions()
        self.budgets = dict(budgets or {})
        self.sampling = dict(sampling) if sampling else None
        #: the sessions' training sampling policy (the whole vocabulary at this temperature; None: no policy)
        self.training_temperature = training_temperature
        self.metadata = dict(metadata or {})
        self.context_window = context_window
        self.max_output_tokens = max_output_tokens
        self.trainer_template_fingerprint = trainer_template_fingerprint
        self.upstream = upstream
        #: the recorder's prompt mode for these sessions (``recorder/prompt_modes/``)
        self.prompt_mode, self.prompt_mode_strict = prompt_mode, prompt_mode_strict
        #: sessions are refused where the served template is not certified exact
        self.require_exact_template = require_exact_template
        wall = self.budgets.get("max_wall_clock_s")
        #: how long wait_for_completion(None) waits: the wall-clock budget plus a margin, else 30 min
        self.wait_timeout_s = wait_timeout_s if wait_timeout_s is not None else (float(wall) + 60.0 if wall else 1800.0)

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> HarnessSession:
        resolved = task_from(task, self.tasks)
        slot = self.pool.place()
        client = RecorderClient(slot.url, self.admin_token)
        sandbox = self.sandbox_factory()
        try:
            sandbox.start_sandbox()
            resolved.place(sandbox)
            agent = launch_agent(
                preset=self.preset,
                sandbox=sandbox,
                client=client,
                recorder_url=slot.agent_url,
                instruction=resolved.instruction,
                model=self.model,
                executable=self.executable or _default_executable(self.preset),
                options=self.options,
                context_window=self.context_window or engine_context_window(client, self.upstream),
                max_output_tokens=self.max_output_tokens,
                budgets=self.budgets,
                metadata={**self.metadata, "task_id": resolved.id, "seed": seed, "episode_id": episode_id},
                sampling=self.sampling,
                training_temperature=self.training_temperature,
                upstream=self.upstream,
                trainer_template_fingerprint=self.trainer_template_fingerprint,
                prompt_mode=self.prompt_mode,
                prompt_mode_strict=self.prompt_mode_strict,
                require_exact_template=self.require_exact_template,
            )
        except BaseException:
            sandbox.close()
            client.close()
            raise
        finally:
            self.pool.release(slot)  # counted by the recorder itself from here on
        return HarnessSession(task=resolved, agent=agent, client=client, close_client=True,
                              wait_timeout_s=self.wait_timeout_s)


@dataclass
class TRLSessionFactory:
    """``harness_session_factory`` for TRL's ``HarnessRolloutWorker`` (loop-owning mode).

    Picklable: only plain data, the factory is built in the worker process on call.
    """

    harness: str
    #: one recorder, or several: sessions are placed by least live sessions
    recorder_url: str | list[str]
    admin_token: str
    model: str
    budgets: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    tasks: dict[str, dict[str, Any]] | None = None
    #: None: the engine's own max_model_len, as the recorder read it from /v1/models
    context_window: int | None = None
    max_output_tokens: int = 4096
    trainer_template_fingerprint: str | None = None
    wait_timeout_s: float | None = None
    prompt_mode: str = "full_history"
    prompt_mode_strict: bool = False
    require_exact_template: bool = False
    #: pin a training sampling policy on every session (the whole vocabulary at this temperature)
    training_temperature: float | None = None

    def __call__(self, sampling: dict[str, Any] | None = None) -> HarnessSessionFactory:
        tasks = None if self.tasks is None else {k: Task.model_validate(v) for k, v in self.tasks.items()}
        return HarnessSessionFactory(
            harness=self.harness,
            recorder_url=self.recorder_url,
            admin_token=self.admin_token,
            model=self.model,
            tasks=tasks,
            options=HarnessOptions(**self.options),
            budgets=self.budgets,
            sampling=sampling,
            training_temperature=self.training_temperature,
            metadata=self.metadata,
            context_window=self.context_window,
            max_output_tokens=self.max_output_tokens,
            trainer_template_fingerprint=self.trainer_template_fingerprint,
            wait_timeout_s=self.wait_timeout_s,
            prompt_mode=self.prompt_mode,
            prompt_mode_strict=self.prompt_mode_strict,
            require_exact_template=self.require_exact_template,
        )
