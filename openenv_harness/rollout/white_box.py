"""``CLIHarnessAdapter`` for real agent CLIs: black-box evaluation and white-box training (D8).

OpenEnv's ``CLIHarnessAdapter.run_white_box`` raises ``NotImplementedError``: an opaque CLI owns its
loop, so the trainer cannot call the model per turn the usual way. Here it can -- the agent runs
unmodified, and the recorder's upstream for its session is the trainer's ``ModelStep``. Every turn
the agent asks for is sampled by the trainer, recorded with the ids and logprobs ``ModelStep``
returned, and replayed to the agent as an ordinary chat completion. ``run_black_box`` runs the same
launch against the recorder's configured engine, for evaluation.

Every field of ``HarnessRunLimits`` is enforced by the recorder (``run_budgets``): ``max_turns``
before each model call, the two tool-call limits on each reply before the agent sees it. The
result is built from the records (``rollout_result.py``): why the run ended, the failed calls and
the tool calls are in it, so a trainer never has to read the store.

The sandbox is any ``Sandbox``: with ``HFSandbox`` the agent runs remotely and reaches the
in-process recorder through the relay, while the ``ModelStep`` still runs here, trainer-side.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from openenv.core.harness import (
    CLIHarnessAdapter,
    HarnessRolloutResult,
    HarnessRunLimits,
    ModelStep,
    ResourceSession,
    ToolResult,
    VerifyResult,
)

from openenv_harness.harnesses.base import HarnessOptions, HarnessPreset
from openenv_harness.harnesses.registry import get_preset
from openenv_harness.recorder.client import RecorderClient
from openenv_harness.recorder.context import RecorderConfig
from openenv_harness.recorder.server import RecorderServer
from openenv_harness.recorder.upstream.model_step import ModelStepUpstream
from openenv_harness.rollout.launch import launch_agent
from openenv_harness.rollout.rollout_result import transcript, rollout_result
from openenv_harness.rollout.tasks import Task, task_from
from openenv_harness.rollout.unscored import unscored_reason
from openenv_harness.sandbox.base import Sandbox


class TaskSession(ResourceSession):
    """An RFC 005 ``ResourceSession`` for a task whose agent brings its own tools.

    The adapter attaches the sandbox the agent worked in, so ``verify`` scores the real final state.
    """

    def __init__(self, task: Task) -> None:
        self.task = task
        self.sandbox: Sandbox | None = None

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.task.instruction}]

    def list_tools(self) -> list[Any]:
        return []

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult(error="the agent CLI runs its own tools")

    def verify(self, transcript: list[dict[str, Any]] | None = None, final_state: Any = None) -> VerifyResult:
        if self.sandbox is None:
            return VerifyResult(env_reward=None, done=True, metrics={"reason": "no sandbox attached"})
        outcome = self.task.verify(self.sandbox)
        return VerifyResult(env_reward=outcome.reward, done=True, metrics={"verify_exit_code": outcome.exit_code},
                            artifacts={"verify_output": outcome.detail})

    def close(self) -> None:
        pass


def _local_sandbox() -> Sandbox:
    from openenv_harness.sandbox.local import LocalSandbox

    return LocalSandbox()


class AgentCLIAdapter(CLIHarnessAdapter):
    """Runs Pi/OpenCode (any preset) as an RFC 005 harness."""

    def __init__(
        self,
        harness: str | HarnessPreset,
        *,
        recorder: RecorderServer | None = None,
        engine_url: str | None = None,
        store_path: str | None = None,
        sandbox_factory: Callable[[], Sandbox] | None = None,
        executable: str | None = None,
        model: str = "policy",
        options: HarnessOptions | None = None,
        timeout_s: float = 600.0,
        context_window: int = 32768,
        max_output_tokens: int = 4096,
    ) -> None:
        super().__init__(runner=self._unused_runner)
        self.preset = get_preset(harness) if isinstance(harness, str) else harness
        self._recorder = recorder
        self._own_recorder = recorder is None
        self._engine_url = engine_url
        self._store_path = store_path
        self._own_store_dir: Path | None = None
        self.sandbox_factory = sandbox_factory or _local_sandbox
        self.executable = executable
        self.model = model
        self.options = options or HarnessOptions()
        self.timeout_s = timeout_s
        self.context_window = context_window
        self.max_output_tokens = max_output_tokens

    @staticmethod
    def _unused_runner(*args: Any) -> HarnessRolloutResult:  # pragma: no cover - run_black_box is overridden
        raise RuntimeError("unreachable")

    def recorder(self) -> RecorderServer:
        """The recorder runs in-process (a thread) unless one was given. Without a ``store_path`` its
        store is a temporary directory of the adapter's own, removed by :meth:`close` (every result
        already carries its records), so a trainer running thousands of rollouts leaves nothing behind."""
        if self._recorder is None:
            if self._store_path is None:
                self._own_store_dir = Path(tempfile.mkdtemp(prefix="oeh-whitebox-"))
            store = self._store_path or str(self._own_store_dir / "records.db")
            config = RecorderConfig(store_path=store, engine_url=self._engine_url, probe_template=False)
            self._recorder = RecorderServer(config).start()
        return self._recorder

    def close(self) -> None:
        if self._own_recorder and self._recorder is not None:
            self._recorder.stop()
            self._recorder = None
        if self._own_store_dir is not None:
            shutil.rmtree(self._own_store_dir, ignore_errors=True)
            self._own_store_dir = None

    def __enter__(self) -> "AgentCLIAdapter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_white_box(
        self, model_step: ModelStep, session: ResourceSession, limits: HarnessRunLimits | None = None
    ) -> HarnessRolloutResult:
        limits = limits or HarnessRunLimits()
        server = self.recorder()
        name = f"model_step-{secrets.token_hex(4)}"
        server.ctx.upstreams[name] = ModelStepUpstream(model_step, sampling=dict(limits.sampling))
        try:
            return self._run(session, limits, upstream=name)
        finally:
            server.ctx.upstreams.pop(name, None)

    def run_black_box(self, session: ResourceSession, limits: HarnessRunLimits | None = None) -> HarnessRolloutResult:
        return self._run(session, limits or HarnessRunLimits(), upstream=None)

    def _run(self, session: ResourceSession, limits: HarnessRunLimits, *, upstream: str | None) -> HarnessRolloutResult:
        server = self.recorder()
        task = session.task if isinstance(getattr(session, "task", None), Task) \
            else task_from(session.initial_messages())
        client = RecorderClient(server.url, server.admin_token)
        sandbox = self.sandbox_factory()
        try:
            sandbox.start_sandbox()
            task.place(sandbox)
            agent = launch_agent(
                preset=self.preset, sandbox=sandbox, client=client, recorder_url=server.url,
                instruction=task.instruction, model=self.model,
                executable=self.executable or _default_executable(self.preset), options=self.options,
                context_window=self.context_window, max_output_tokens=self.max_output_tokens,
                budgets=run_budgets(limits), upstream=upstream,
                sampling=dict(limits.sampling) if limits.sampling and upstream is None else None,
                metadata={"task_id": task.id, "mode": "white_box" if upstream else "black_box"},
            )
            code = agent.wait(self.timeout_s)
            timed_out = code is None
            if timed_out:
                agent.kill()
            client.close_session(agent.session_id, grace_s=0 if timed_out else None)
            records = client.records(agent.session_id)
            info = client.session(agent.session_id)
            if isinstance(session, TaskSession):
                session.sandbox = sandbox
            verified = session.verify(transcript(records))
            # an infrastructure fault (recorder, engine, relay, sandbox, a CLI crash) is never a score
            unscored = unscored_reason(agent.result(), session_info=lambda: info,
                                       sandbox_faults=sandbox.infrastructure_faults(), timed_out=timed_out)
            return rollout_result(records=records, session=info, outcome=agent.result(), verified=verified,
                                  process_exit_code=code, timed_out=timed_out, unscored=unscored)
        finally:
            if isinstance(session, TaskSession):
                session.sandbox = None
            sandbox.close()
            client.close()


def run_budgets(limits: HarnessRunLimits) -> dict[str, Any]:
    """RFC 005's run limits as the recorder's session budgets: ``max_turns`` caps the agent's model
    calls before each call; the tool-call limits cut each reply before the agent sees it
    (``recorder/session/budget.py`` says what the agent then receives)."""
    budgets: dict[str, Any] = {"max_agent_calls": limits.max_turns}
    if limits.max_tool_calls_per_turn is not None:
        budgets["max_tool_calls_per_turn"] = limits.max_tool_calls_per_turn
    if limits.max_total_tool_calls is not None:
        budgets["max_total_tool_calls"] = limits.max_total_tool_calls
    return budgets


def _default_executable(preset: HarnessPreset) -> str:
    from openenv_harness.harnesses.install import binary_path

    return str(binary_path(preset))
