"""One rollout, end to end, summarized: what a person (or a CI log) wants to see afterwards.

Used by the ``openenv-harness run`` command and the OpenEnv environment: run the agent to
completion, score it with the task's verifier, and condense its records into calls, tokens and
chain status (exact / replay drift / break transitions, and the training rows a reconciler that
forks on anything but exact would make).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from openenv_harness.rollout.factory import HarnessSessionFactory
from openenv_harness.rollout.session import HarnessSession


@dataclass
class RolloutReport:
    session_id: str
    harness: str
    task: str
    exit_code: int | None = None
    #: the recorder's prompt mode for this rollout (full_history or incremental)
    prompt_mode: str = "full_history"
    agent_ok: bool = False
    reward: float | None = None
    #: why ``reward`` is None: an infrastructure fault, never a failed task (``unscored.py``)
    unscored_reason: str | None = None
    timed_out: bool = False
    calls: int = 0
    agent_calls: int = 0
    aux_calls: int = 0
    failed_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    fidelity: dict[str, int] = field(default_factory=dict)
    rows: int = 0
    stop_reason: str | None = None
    error: str | None = None
    final_answer: str | None = None
    wall_s: float = 0.0
    #: what a trainer gets from the records (rows and trainable share per assembly strategy, constrained
    #: calls), filled in by whoever assembles them (``openenv-harness run``)
    training: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def chain_status(self) -> str:
        """The chain's transitions as counted: a single call has none, so it is not called exact."""
        exact = self.fidelity.get("exact", 0)
        drift = self.fidelity.get("replay_drift", 0)
        brk = self.fidelity.get("break", 0)
        if not self.agent_calls:
            return "no calls"
        if exact + drift + brk == 0:
            return "single call"
        if drift == brk == 0:
            return f"exact ({exact} transitions)"
        return f"{exact} exact, {drift} drift, {brk} break"


def summarize_records(report: RolloutReport, records: list[dict[str, Any]]) -> RolloutReport:
    counts = {"exact": 0, "replay_drift": 0, "break": 0}
    for r in records:
        md = r["metadata"]
        report.calls += 1
        if md.get("status") == "failed":
            report.failed_calls += 1
            continue
        if md.get("call_kind") == "aux":
            report.aux_calls += 1
        else:
            report.agent_calls += 1
            fid = (md.get("fidelity") or {}).get("class")
            if fid in counts:
                counts[fid] += 1
        report.prompt_tokens += len(r.get("prompt_token_ids") or [])
        report.completion_tokens += len(r.get("completion_token_ids") or [])
    report.fidelity = counts
    report.rows = (1 + counts["replay_drift"] + counts["break"]) if report.agent_calls else 0
    return report


def run_rollout(factory: HarnessSessionFactory, task: Any, *, timeout_s: float = 600.0,
                seed: int | None = None, episode_id: str | None = None) -> tuple[RolloutReport, HarnessSession | None]:
    """Create, run, verify and summarize one rollout. The session is returned open (caller closes)."""
    started = time.time()
    try:
        session = factory.create(task, seed=seed, episode_id=episode_id)
    except Exception as exc:  # a rollout that could not start is reported, not raised
        name = task if isinstance(task, str) else getattr(task, "id", "task")
        return RolloutReport(session_id="", harness=factory.preset.name, task=str(name),
                             error=f"could not start: {exc}", wall_s=round(time.time() - started, 2)), None
    report = RolloutReport(session_id=session.session_id, harness=factory.preset.name, task=session.task.id)
    try:
        try:
            report.exit_code = session.wait_for_completion(timeout_s)
        except TimeoutError:
            report.timed_out = True
        verified = session.verify([])
        report.reward = verified.env_reward
        report.unscored_reason = verified.metrics.get("unscored_reason")
        result = session.agent.result()
        report.agent_ok = result.ok
        report.final_answer = result.final_answer
        report.error = result.error
        info = session.client.session(session.session_id)
        report.stop_reason = info.get("stop_reason")
        if info.get("last_error") and not report.error:
            report.error = info["last_error"].get("message")
        summarize_records(report, session.client.records(session.session_id))
    except Exception as exc:
        report.error = f"{type(exc).__name__}: {exc}"
    report.wall_s = round(time.time() - started, 2)
    return report, session
