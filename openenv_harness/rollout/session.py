"""A loop-owning rollout session: OpenEnv's ``ResourceSession`` + ``TrainableSession`` + ``LoopOwningSession``.

TRL 1.16's harness worker creates one of these per rollout, waits for the agent, reads the trace
and asks for the reward. Three promises matter to a trainer:

- ``fetch_training_trace()`` returns OpenEnv's own ``TrainingTrace``, validated by OpenEnv, holding
  only agent calls in call order (aux calls are left out: even masked, one in the middle splits
  TRL's chain).
- A capture that cannot be made valid fails *this* rollout with ``RolloutCaptureError`` (a
  ``RuntimeError``), never a ``ValueError``/``KeyError``/``TypeError``: TRL turns those into a
  contract error that stops the whole training run.
- ``verify()`` returns the environment's reward (the task's verifier in the sandbox); ``None`` is
  unscored.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx
from openenv.core.harness import ResourceSession, ToolResult, TrainingTrace, VerifyResult

from openenv_harness.harnesses.base import HarnessResult
from openenv_harness.recorder.client import RecorderAPIError, RecorderClient
from openenv_harness.rollout.launch import LaunchedAgent
from openenv_harness.rollout.tasks import Task, VerifyOutcome
from openenv_harness.rollout.unscored import unscored_reason
from openenv_harness.sandbox.base import SandboxError

log = logging.getLogger(__name__)


class RolloutCaptureError(RuntimeError):
    """This rollout's records cannot form a valid training trace (the rollout is unscorable)."""


class HarnessSession(ResourceSession):
    """One agent run on one task, recorded by the recorder."""

    def __init__(self, *, task: Task, agent: LaunchedAgent, client: RecorderClient, close_client: bool = False,
                 wait_timeout_s: float | None = 1800.0) -> None:
        self.task = task
        self.agent = agent
        self.client = client
        self._close_client = close_client
        #: deadline used when a caller waits without one (TRL does): an agent stuck in a tool never
        #: calls the model, so the recorder's wall-clock budget alone cannot end it
        self.wait_timeout_s = wait_timeout_s
        self.exit_code: int | None = None
        self.timed_out = False
        self.verify_outcome: VerifyOutcome | None = None
        #: why the sandbox failed under the agent, when it did (the rollout is then unscored)
        self.sandbox_failure: str | None = None
        self._closed = False

    @property
    def session_id(self) -> str:
        return self.agent.session_id

    @property
    def sandbox(self):  # noqa: ANN201 - the Sandbox the agent runs in
        return self.agent.sandbox

    # -- ResourceSession ---------------------------------------------------------------------------

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.task.instruction}]

    def list_tools(self) -> list[Any]:
        return []  # the agent brings its own tools

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        return ToolResult(error=f"{self.agent.preset.name} runs its own tools; {name!r} cannot be called from outside")

    def verify(self, transcript: list[dict[str, Any]] | None = None, final_state: Any = None) -> VerifyResult:
        if self.verify_outcome is None:
            try:
                if self.agent.process.poll() is None:
                    self.agent.kill()  # score the final state, not a moving target
            except SandboxError as exc:
                self.sandbox_failure = self.sandbox_failure or str(exc)
            if self.sandbox_failure is not None:
                self.verify_outcome = VerifyOutcome(reward=None, detail=f"sandbox failed: {self.sandbox_failure}")
            else:
                self.verify_outcome = self.task.verify(self.agent.sandbox)
        outcome = self.verify_outcome
        result = self.agent.result()
        unscored = self._infrastructure_failure(result)
        if unscored is None and outcome.reward is None:
            unscored = outcome.detail or "the verifier could not score the sandbox"
        self._record_outcome(None if unscored else outcome.reward, unscored)
        return VerifyResult(
            env_reward=None if unscored else outcome.reward,
            done=True,
            metrics={
                **outcome.metrics,
                "exit_code": self.exit_code,
                "agent_ok": result.ok,
                "timed_out": self.timed_out,
                "verify_exit_code": outcome.exit_code,
                "unscored_reason": unscored,
            },
            artifacts={"verify_output": outcome.detail, "final_answer": result.final_answer, "agent_error": result.error},
        )

    def _record_outcome(self, reward: float | None, unscored: str | None) -> None:
        """Store the outcome beside the session's records, so exports carry the reward with every row.
        A recorder that cannot take it leaves the reward with the caller (said in the log), not lost."""
        try:
            self.client.set_outcome(self.session_id, reward=reward, unscored_reason=unscored)
        except Exception as exc:  # noqa: BLE001 -- the reward is still returned to the trainer
            log.warning("session %s: the recorder did not store the rollout's outcome: %s", self.session_id, exc)

    def _infrastructure_failure(self, result: HarnessResult) -> str | None:
        """Why this rollout must stay unscored (D7, ``unscored.py``), or None.

        An agent that stopped because the engine, the recorder, the relay or the sandbox failed, or
        whose CLI crashed with no model call to blame, did not fail the task: scoring its sandbox
        would put a 0.0 into the group baseline for an infrastructure fault. A budget stop is the
        policy's own doing and is scored.
        """
        faults = list(self._sandbox_faults())
        if self.sandbox_failure is not None:
            faults.insert(0, f"sandbox failed: {self.sandbox_failure}")
        return unscored_reason(result, session_info=lambda: self.client.session(self.session_id),
                               sandbox_faults=faults, timed_out=self.timed_out)

    def _sandbox_faults(self) -> list[str]:
        try:
            return self.agent.sandbox.infrastructure_faults()
        except Exception as exc:  # noqa: BLE001 -- a sandbox that cannot even say is a fault itself
            return [f"the sandbox could not report its state: {type(exc).__name__}: {exc}"]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.agent.kill()
        finally:
            try:
                self.client.close_session(self.session_id, grace_s=0)  # the agent is gone: nothing waits
            except (RecorderAPIError, OSError, httpx.TransportError):
                pass
            finally:
                self.agent.sandbox.close()
                if self._close_client:
                    self.client.close()

    # -- LoopOwningSession / TrainableSession ------------------------------------------------------

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        """The agent's exit code (non-zero when the agent reported a failure, even if its process
        exited 0). On timeout the agent is killed and ``TimeoutError`` raised (TRL then still trains
        what was captured and flags the rollout as timed out)."""
        if timeout_s is None:
            timeout_s = self.wait_timeout_s
        try:
            code = self.agent.wait(timeout_s)
        except SandboxError as exc:  # the sandbox failed under the agent: unscored (``verify``), not raised
            self.sandbox_failure = str(exc)
            self._stop_recording()
            self.exit_code = 1
            return 1
        if code is None:
            self.timed_out = True
            self.agent.kill()
            self._stop_recording(grace_s=0)  # its call in flight has no reader: cancelled, not trained on
            raise TimeoutError(f"agent {self.agent.preset.name} did not finish within {timeout_s}s")
        self._stop_recording()
        # the agent's own verdict: Pi's JSON mode exits 0 even when its model call failed
        self.exit_code = self.agent.result().exit_code
        return self.exit_code if self.exit_code is not None else code

    def _stop_recording(self, grace_s: float | None = None) -> None:
        """Close the recorder session: from then on its trace is final. ``grace_s=0`` when the agent
        was killed: a call it left at the engine is cancelled (recorded untrainable), since the
        agent never saw its answer; an agent that exited on its own left none of its own."""
        try:
            self.client.close_session(self.session_id, grace_s=grace_s)
        except (RecorderAPIError, OSError, httpx.TransportError):
            pass

    def fetch_proxy_trace(self) -> list[dict[str, Any]]:
        """Every record that carries tokens (agent and aux), as OpenEnv ``TraceEntry`` dicts."""
        try:
            return self.client.records(self.session_id, include="tokens")
        except httpx.TransportError as exc:
            raise RolloutCaptureError(self._unreachable(exc)) from None

    def fetch_training_trace(self) -> TrainingTrace:
        try:
            data = self.client.training_trace_json(self.session_id)
        except RecorderAPIError as exc:
            raise RolloutCaptureError(f"recorder could not produce a training trace: {exc}") from None
        except httpx.TransportError as exc:
            raise RolloutCaptureError(self._unreachable(exc)) from None
        try:
            return TrainingTrace.model_validate(data)
        except (ValueError, TypeError, KeyError) as exc:
            raise RolloutCaptureError(f"recorded calls of session {self.session_id} are not a valid trace: {exc}") from None

    def _unreachable(self, exc: Exception) -> str:
        """The session's records live on one recorder only: say which, and that it is not answering."""
        return (f"recorder {self.client.base_url} holding session {self.session_id} is unreachable "
                f"({type(exc).__name__}: {exc}); its acknowledged records are in its store once it is back")

    # -- reporting -----------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        info = self.client.session(self.session_id)
        result = self.agent.result()
        return {
            "session_id": self.session_id,
            "task": self.task.id,
            "harness": self.agent.preset.name,
            "exit_code": self.exit_code,
            "agent_ok": result.ok,
            "final_answer": result.final_answer,
            "agent_error": result.error,
            "reward": self.verify_outcome.reward if self.verify_outcome else None,
            "timed_out": self.timed_out,
            "wall_s": round(time.time() - self.agent.started_at, 2),
            "recorder": info,
            "recorder_url": self.client.base_url,
        }
