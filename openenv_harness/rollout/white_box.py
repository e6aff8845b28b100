"""``CLIHarnessAdapter`` for real agent CLIs: black-box evaluation and white-box training (D8).

OpenEnv's ``CLIHarnessAdapter.run_white_box`` raises ``NotImplementedError``: an opaque CLI owns its
loop, so the trainer cannot call the model per turn the usual way. Here it can -- the agent runs
unmodified, and the recorder's upstream for its session is the trainer's ``ModelStep``. Every turn
the agent asks for is sampled by the trainer, recorded with the ids and logprobs ``ModelStep``
returned, and replayed to the agent as an ordinary chat completion. ``run_black_box`` runs the same
launch against the recorder's configured engine, for evaluation.
"""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path
from typing import Any, Callable

from openenv.core.harness import (
    CLIHarnessAdapter,
    HarnessRolloutResult,
    HarnessRunLimits,
    ModelStep,
    ResourceSession,
    RolloutEvent,
    ToolResult,
    VerifyResult,
)

from openenv_harness.contract import is_training_entry
from openenv_harness.harnesses.base import HarnessOptions, HarnessPreset
from openenv_harness.harnesses.registry import get_preset
from openenv_harness.recorder.client import RecorderClient
from openenv_harness.recorder.context import RecorderConfig
from openenv_harness.recorder.server import RecorderServer
from openenv_harness.recorder.upstream.model_step import ModelStepUpstream
from openenv_harness.rollout.launch import launch_agent
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
        """The recorder runs in-process (a thread) unless one was given."""
        if self._recorder is None:
            store = self._store_path or str(Path(tempfile.mkdtemp(prefix="oeh-whitebox-")) / "records.db")
            config = RecorderConfig(store_path=store, engine_url=self._engine_url, probe_template=False)
            self._recorder = RecorderServer(config).start()
        return self._recorder

    def close(self) -> None:
        if self._own_recorder and self._recorder is not None:
            self._recorder.stop()
            self._recorder = None

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
        task = session.task if isinstance(getattr(session, "task", None), Task) else task_from(session.initial_messages())
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
                budgets={"max_agent_calls": limits.max_turns}, upstream=upstream,
                metadata={"task_id": task.id, "mode": "white_box" if upstream else "black_box"},
            )
            code = agent.wait(self.timeout_s)
            timed_out = code is None
            if timed_out:
                agent.kill()
            client.close_session(agent.session_id, grace_s=0 if timed_out else None)
            records = client.records(agent.session_id, include="tokens")
            if isinstance(session, TaskSession):
                session.sandbox = sandbox
            unscored = unscored_reason(agent.result(), session_info=lambda: client.session(agent.session_id),
                                       sandbox_faults=sandbox.infrastructure_faults(), timed_out=timed_out)
            return self._result(agent, records, session, code, timed_out, unscored)
        finally:
            if isinstance(session, TaskSession):
                session.sandbox = None
            sandbox.close()
            client.close()

    def _result(self, agent: Any, records: list[dict[str, Any]], session: ResourceSession, code: int | None,
                timed_out: bool, unscored: str | None = None) -> HarnessRolloutResult:
        agent_records = [r for r in records if is_training_entry(r)]
        messages: list[dict[str, Any]] = []
        if agent_records:
            last = agent_records[-1]
            messages = list(last["request"].get("messages", []))
            choice = (last["response"].get("choices") or [{}])[0]
            if isinstance(choice.get("message"), dict):
                messages.append(choice["message"])
        verified = session.verify(messages)
        outcome = agent.result()
        result = HarnessRolloutResult(messages=messages, done=True)
        for r in agent_records:
            result.prompt_ids.extend(r["prompt_token_ids"])
            result.completion_ids.extend(r["completion_token_ids"])
            result.logprobs.extend(r["per_token_logps"])
            md = r["metadata"]
            result.events.append(RolloutEvent(type="model_call", payload={
                "node_id": md["node_id"], "fidelity": md.get("fidelity"), "finish_reason": md.get("finish_reason"),
                "prompt_tokens": len(r["prompt_token_ids"]), "completion_tokens": len(r["completion_token_ids"]),
            }))
        result.metrics = {
            "session_id": agent.session_id,
            "exit_code": code,
            "timed_out": timed_out,
            "agent_ok": outcome.ok,
            "final_answer": outcome.final_answer,
            "agent_calls": len(agent_records),
            "aux_calls": sum(1 for r in records if r["metadata"].get("call_kind") == "aux"),
            "env_reward": None if unscored else verified.env_reward,
            "unscored_reason": unscored,
            "verify": verified.metrics,
            "trace_entries": records,
        }
        return result


def _default_executable(preset: HarnessPreset) -> str:
    from openenv_harness.harnesses.install import binary_path

    return str(binary_path(preset))
