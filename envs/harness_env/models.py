"""The wire types of the harness environment: one action, one observation, one state.

An episode is one agent rollout. ``reset`` places a task in a fresh sandbox, opens a recorder
session and starts the agent CLI; the single action ``RunAgent`` lets the agent run to completion
and returns the outcome. So the observation is mostly a report: how the agent ended, the reward
the task's verifier gave, a summary of the recorded calls and *where* the full records are. The
records themselves (token ids and logprobs for every call, often megabytes) stay with the recorder
and are read through its admin API; an observation never carries them.

``reward`` is ``None`` when the verifier could not score the run (no verifier, it crashed or timed
out): an unscored rollout, which a trainer leaves out of its baseline -- never a 0.0.
"""

from __future__ import annotations

from typing import Literal

from openenv.core.env_server.types import Action, Observation, State
from pydantic import BaseModel, ConfigDict, Field

#: Agent runs are long compared with a typical environment step; this bounds one step.
MAX_STEP_TIMEOUT_S = 24 * 3600.0


class RunAgent(Action):
    """Let the agent started by ``reset`` run until it exits (or ``timeout_s`` passes), then score it."""

    timeout_s: float | None = Field(
        None,
        gt=0,
        le=MAX_STEP_TIMEOUT_S,
        description="Seconds to wait for the agent; on expiry it is killed and the final state scored. "
        "Default: the server's step timeout (OEH_STEP_TIMEOUT_S).",
    )


class TraceSummary(BaseModel):
    """The recorded calls of one rollout, condensed (the records stay with the recorder)."""

    model_config = ConfigDict(extra="forbid")

    calls: int = Field(0, description="Every recorded call, failed ones included")
    agent_calls: int = 0
    aux_calls: int = Field(0, description="Title/summary calls the recorder classified as auxiliary")
    failed_calls: int = Field(0, description="Calls the engine did not answer (no tokens exist)")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    chain: dict[str, int] = Field(
        default_factory=dict,
        description="Agent-call transitions by class: exact (prompt extends the previous prompt + sampled ids), "
        "replay_drift, break",
    )
    chain_status: str = Field("no calls", description="'exact', 'N drift, M break' or 'no calls'")
    rows: int = Field(0, description="Training rows a reconciler that forks on anything but 'exact' would make")
    stop_reason: str | None = Field(None, description="The budget that stopped the session, if one did")


class RecordsLocation(BaseModel):
    """Where the full records of a rollout are: the recorder's admin API (admin token required)."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    recorder_url: str = Field(description="The recorder's root URL, as the environment server reaches it")
    records_path: str = Field(description="GET {recorder_url}{records_path}: every record as OpenEnv TraceEntry dicts")
    training_trace_path: str = Field(description="GET {recorder_url}{training_trace_path}: OpenEnv's TrainingTrace")
    proxy_path: str | None = Field(
        None,
        description="The same records through the environment server itself: GET {env_url}{proxy_path}. "
        "Present when the recorder runs inside the environment server.",
    )


class HarnessObservation(Observation):
    """What ``reset`` (agent started, ``done=False``) and ``RunAgent`` (agent finished, ``done=True``) return."""

    task_id: str = ""
    harness: str = ""
    instruction: str = Field("", description="What the agent was asked to do")
    session_id: str = Field("", description="The recorder session holding this rollout's records")
    exit_code: int | None = Field(None, description="The agent's verdict: 0 on success, None while running or on timeout")
    agent_ok: bool | None = None
    timed_out: bool = False
    final_answer: str | None = None
    error: str | None = Field(None, description="Why the agent or its model calls failed, if they did")
    verify_output: str = Field("", description="The tail of the verifier's output")
    trace: TraceSummary | None = None
    records: RecordsLocation | None = None
    wall_s: float | None = Field(None, description="Seconds from the agent's start to the end of scoring")


class HarnessState(State):
    """The episode as the server sees it."""

    task_id: str | None = None
    harness: str | None = None
    session_id: str | None = None
    phase: Literal["idle", "running", "done"] = "idle"
    reward: float | None = None
