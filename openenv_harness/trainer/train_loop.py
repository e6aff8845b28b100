"""The RL loop closed on one machine: rollouts -> update -> weight sync through the fence -> rollouts.

What it proves, each step on the real parts (a real agent CLI, the recorder, a real vLLM, the
model in transformers):

1. a group of agent rollouts through the recorder in incremental mode, recorded at policy
   version ``v``; each assembled into rows (the project's assembler, and TRL's own
   ``_chain_to_sequences`` where TRL is installed: the two must give the same trainable tokens);
2. the trainer's logprobs of those rows against the engine's (the step-0 check at ``v``: ratio ~1,
   which measures this machine's bf16/fp32 noise floor), then one GRPO step on them;
3. the new weights written to a folder and loaded into the running engine through the recorder's
   fence (``weight_sync.py``): pause, load, drop the prefix cache, bump the version, resume;
4. the next rollouts, whose records carry ``v + 1``; the trainer's new weights score them at the
   floor, and the old weights (a deliberately stale trainer) do not.

The reward is the task's verdict plus a brevity bonus (``brevity``): a 0.5B model asked to fix a
file through an agent mostly answers in text and fails the task, and a group whose rewards tie
has no advantage to learn from. The bonus ranks the group so that one step moves the weights.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from openenv_harness.assembly import assemble_session
from openenv_harness.recorder.client import RecorderClient
from openenv_harness.rollout.report import run_rollout
from openenv_harness.rollout import BUILTIN_TASKS
from openenv_harness.trainer.grpo import StepReport, TrainSample, group_advantages, grpo_step, samples_from_traces
from openenv_harness.trainer.grpo import train_last_layers
from openenv_harness.trainer.limits import DEFAULT_LIMITS, DeltaStats
from openenv_harness.trainer.verify import load_model, verify_records
from openenv_harness.trainer.weight_sync import DiskWeightSync, SyncReport


#: Sampling from the whole distribution the trainer's log-softmax scores: the model's generation config
#: would otherwise truncate it (Qwen2.5: top_p 0.8, top_k 20, repetition penalty 1.05), and a policy
#: gradient over samples drawn from a truncated distribution, weighted by the untruncated logprobs the
#: engine records (raw_logprobs), is biased
FULL_VOCABULARY: dict[str, Any] = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}


@dataclass
class LoopSettings:
    """One loop iteration's knobs. The defaults fit a 2-core CPU: a few minutes a phase."""

    engine_url: str
    recorder_url: str
    admin_token: str
    model: str
    model_dir: Path
    workdir: Path
    harness: str = "pi"
    task: str = "fix-add"
    group: int = 4
    next_rollouts: int = 2
    max_tokens: int = 96
    temperature: float = 1.0
    seed: int = 0
    learning_rate: float = 1e-4
    layers: int = 2
    brevity: float = 0.5
    max_agent_calls: int = 2
    rollout_timeout_s: float = 600.0


@dataclass
class RolloutSummary:
    session_id: str
    seed: int
    policy_versions: list[int]
    task_reward: float | None
    reward: float | None
    calls: int
    sampled_tokens: int
    rows: int
    trainable_tokens: int
    #: TRL's own reconciliation of the same records gives the same trainable tokens (None: TRL absent)
    trl_agrees: bool | None = None
    error: str | None = None


@dataclass
class LoopReport:
    settings: dict[str, Any]
    version_before: int
    version_after: int
    before: list[RolloutSummary]
    step: StepReport
    sync: SyncReport
    after: list[RolloutSummary]
    #: the trainer's logprobs of the version-v records against the engine's (the noise floor)
    check_before: DeltaStats
    #: the trainer's new weights on the version-v+1 records (must sit at the floor)
    check_after: DeltaStats
    #: the old weights on the version-v+1 records (must not)
    check_stale: DeltaStats
    phases: dict[str, float] = field(default_factory=dict)
    restored: SyncReport | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def problems(self) -> list[str]:
        """What keeps this iteration from proving the loop (empty: proven). Each step-0 check is held to
        the limits ``trace verify`` applies (``trainer/limits.py``, derived in docs/real-engine.md)."""
        out = []
        if any(r.policy_versions != [self.version_after] for r in self.after):
            out.append(f"records after the sync do not all carry version {self.version_after}")
        if self.version_after != self.version_before + 1:
            out.append(f"the sync moved the version from {self.version_before} to {self.version_after}")
        before = DEFAULT_LIMITS.failures(self.check_before)
        if before:
            out.append(f"the version {self.version_before} weights do not score the version {self.version_before} "
                       "records within the step-0 limits (" + "; ".join(f.text for f in before) + ")")
        if not self.at_floor:
            out.append("the new weights do not score the new records within the step-0 limits ("
                       + "; ".join(f.text for f in DEFAULT_LIMITS.failures(self.check_after)) + ")")
        if not self.stale_detected:
            out.append(f"the stale weights were not told apart from the new ones (mean |δ| "
                       f"{self.check_stale.delta_mean:.4f} against {self.check_after.delta_mean:.4f}; "
                       f"limits: {DEFAULT_LIMITS.summary()})")
        if any(r.trl_agrees is False for r in [*self.before, *self.after]):
            out.append("TRL's reconciliation of the records differs from the project's assembler")
        return out

    @property
    def stale_detected(self) -> bool:
        """The old weights -- a trainer that missed the sync -- score the new records outside the step-0
        limits, and clearly further than the new weights do (mean |δ| more than twice theirs): the check
        that passes the synced trainer fails the stale one."""
        return (bool(DEFAULT_LIMITS.failures(self.check_stale))
                and self.check_stale.delta_mean > 2 * self.check_after.delta_mean)

    @property
    def at_floor(self) -> bool:
        """The new weights score the new records within the step-0 limits: the same bound ``trace verify``
        applies to any session, not a multiple of this run's own floor."""
        return not DEFAULT_LIMITS.failures(self.check_after)


def shaped_reward(task_reward: float | None, sampled_tokens: int, calls: int, settings: LoopSettings) -> float | None:
    """The task's verdict plus ``brevity`` x the share of the token budget left unused; None stays None
    (an unscored rollout is an infrastructure fault, not a zero)."""
    if task_reward is None:
        return None
    budget = max(1, settings.max_tokens * max(1, calls))
    return float(task_reward) + settings.brevity * (1.0 - min(1.0, sampled_tokens / budget))


def trainable_view(input_ids: Sequence[int], mask: Sequence[int], logprobs: Sequence[float],
                   offset: int = 0) -> list[tuple[int, int, float]]:
    """(position in the sequence, id, old logprob) of every trainable token: what two assemblers must agree on."""
    return [(offset + i, input_ids[offset + i], round(float(lp), 6))
            for i, (m, lp) in enumerate(zip(mask, logprobs)) if m]


def _trl_view(client: RecorderClient, session_id: str) -> list[list[tuple[int, int, float]]] | None:
    """TRL's rows of the session (its ``_chain_to_sequences`` on OpenEnv's TrainingTrace), or None without TRL."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    try:
        from openenv.core.harness import TrainingTrace
        from trl.experimental.async_grpo.async_rollout_worker import _chain_to_sequences
        from trl.experimental.async_grpo.openenv_harness import _turns_from_training_trace
    except ImportError:
        return None
    trace = TrainingTrace.model_validate(client.training_trace_json(session_id))
    rows, _tally = _chain_to_sequences(_turns_from_training_trace(trace), session_id, 0)
    return [trainable_view(r.input_ids, r.completion_mask, r.old_log_probs) for r in rows]


class TrainLoop:
    """One iteration of the loop against an engine behind a recorder; ``run()`` returns its report."""

    def __init__(self, settings: LoopSettings, *, progress: Callable[[str], None] | None = None) -> None:
        if settings.group < 2:
            raise ValueError("a GRPO group needs at least 2 rollouts")
        if settings.task not in BUILTIN_TASKS:
            raise ValueError(f"unknown task {settings.task!r}; built-in tasks: {', '.join(sorted(BUILTIN_TASKS))}")
        self.settings = settings
        self.progress = progress or (lambda _m: None)
        self.client = RecorderClient(settings.recorder_url, settings.admin_token)
        self.sync = DiskWeightSync(self.client, settings.engine_url)
        self.phases: dict[str, float] = {}
        self._traces: dict[str, list[Any]] = {}

    def _timed(self, name: str, fn: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return fn()
        finally:
            self.phases[name] = round(time.perf_counter() - started, 2)

    def rollouts(self, count: int, first_seed: int) -> tuple[list[RolloutSummary], list[list[dict[str, Any]]]]:
        """``count`` rollouts of the task, one after the other (seeds ``first_seed`` ...), and their records."""
        from openenv_harness.rollout import HarnessSessionFactory

        s = self.settings
        summaries: list[RolloutSummary] = []
        records: list[list[dict[str, Any]]] = []
        for seed in range(first_seed, first_seed + count):
            factory = HarnessSessionFactory(
                harness=s.harness, recorder_url=s.recorder_url, admin_token=s.admin_token, model=s.model,
                tasks={s.task: BUILTIN_TASKS[s.task]}, prompt_mode="incremental",
                budgets={"max_agent_calls": s.max_agent_calls, "max_wall_clock_s": s.rollout_timeout_s},
                sampling={**FULL_VOCABULARY, "temperature": s.temperature, "seed": seed, "max_tokens": s.max_tokens})
            report, session = run_rollout(factory, s.task, timeout_s=s.rollout_timeout_s + 30, seed=seed)
            if session is None:
                raise RuntimeError(f"rollout {seed} could not start: {report.error}")
            try:
                entries = self.client.records(session.session_id)
                agent = [r for r in entries if r["metadata"]["call_kind"] == "agent" and r["metadata"]["status"] == "ok"]
                sampled = sum(len(r["completion_token_ids"]) for r in agent)
                reward = shaped_reward(report.reward, sampled, len(agent), s)
                assembled = assemble_session(entries, reward=reward) if agent else None
                traces = assembled.traces if assembled is not None else []
                self._traces[session.session_id] = traces  # the rows the update trains on, assembled once
                ours = [trainable_view(t.input_ids, t.loss_mask, t.response_logprobs, len(t.prompt_ids))
                        for t in traces if t.trainable_tokens]
                theirs = _trl_view(self.client, session.session_id) if agent else None
                summaries.append(RolloutSummary(
                    session.session_id, seed, sorted({r["metadata"]["policy_version_start"] for r in agent}
                                                     | {r["metadata"]["policy_version_end"] for r in agent}),
                    report.reward, reward, len(agent), sampled, len(traces), sum(t.trainable_tokens for t in traces),
                    None if theirs is None else theirs == ours, report.error))
                records.append(entries)
            finally:
                session.close()
            last = summaries[-1]
            self.progress(f"rollout {len(summaries)}/{count}: {last.calls} call(s), {last.sampled_tokens} sampled ids, "
                          f"task reward {last.task_reward}, reward {last.reward if last.reward is None else round(last.reward, 3)}, "
                          f"policy version {last.policy_versions}" + (f"; error: {last.error}" if last.error else ""))
        return summaries, records

    def _group(self) -> tuple[list[RolloutSummary], list[list[dict[str, Any]]], list[tuple[RolloutSummary, Any]],
                              list[float]]:
        """The group before the update. A group whose rewards all tie carries no advantage: one more rollout
        is drawn at a time until the rewards rank, up to twice the group's size (then the step is a no-op,
        and the report says so)."""
        s = self.settings
        before, records = self.rollouts(s.group, s.seed)
        while True:
            scored = [(summary, recs) for summary, recs in zip(before, records) if summary.reward is not None]
            if len(scored) < 2:
                errors = sorted({r.error for r in before if r.reward is None and r.error})
                raise RuntimeError(f"{len(before) - len(scored)} of {len(before)} rollouts came back unscored, no "
                                   "group to learn from" + (f" ({'; '.join(errors)})" if errors else ""))
            advantages = group_advantages([summary.reward for summary, _ in scored])  # type: ignore[misc]
            if any(advantages) or len(before) >= 2 * s.group:
                return before, records, scored, advantages
            self.progress("the group's rewards tie (no advantage): drawing one more rollout")
            more, more_records = self.rollouts(1, s.seed + len(before))
            before, records = before + more, records + more_records

    def run(self) -> LoopReport:
        s = self.settings
        torch = _torch()
        self._timed("check_engine", self.sync.check)
        version = int(self.client.health()["fence"]["policy_version"])  # a trainer may resume at any version
        self.progress(f"rollouts at policy version {version}: {s.group} x {s.harness} on {s.task} (incremental mode)")
        before, before_records, scored, advantages = self._timed("rollouts_before", self._group)
        samples: list[TrainSample] = []
        for (summary, _recs), advantage in zip(scored, advantages):
            samples.extend(samples_from_traces(self._traces[summary.session_id], advantage, summary.session_id))

        self.progress(f"loading the model from {s.model_dir} (trainer, float32)")
        base, _tokenizer = self._timed("load_models", lambda: load_model(str(s.model_dir), dtype="float32"))
        check_before = self._timed("check_before", lambda: _check(base, before_records))
        self.progress(f"step-0 check at version {version}: mean |delta| {check_before.delta_mean:.4f} over "
                      f"{check_before.tokens} tokens (the noise floor)")
        policy, trained = _sharing_frozen(base, s.layers)
        optimizer = torch.optim.Adam(trained, lr=s.learning_rate)
        self.progress(f"one GRPO step: {len(samples)} row(s), advantages {[round(a, 3) for a in advantages]}")
        step = self._timed("update", lambda: grpo_step(policy, optimizer, samples))
        weights = s.workdir / f"policy-v{version + 1}"
        self._timed("save_weights", lambda: _save_as_served(policy, trained, weights))
        self.progress(f"syncing {weights} into the engine through the recorder's fence")
        sync = self._timed("weight_sync", lambda: self.sync.sync(weights, version_before=version))
        self.progress(f"engine reloaded in {sync.phases.get('load', 0):.1f} s; recorder at version {sync.version_after}")

        after, after_records = self._timed("rollouts_after", lambda: self.rollouts(s.next_rollouts, s.seed + len(before)))
        check_after = self._timed("check_after", lambda: _check(policy, after_records))
        check_stale = self._timed("check_stale", lambda: _check(base, after_records))
        return LoopReport(asdict(s) | {"model_dir": str(s.model_dir), "workdir": str(s.workdir)}, version,
                          sync.version_after, before, step, sync, after, check_before, check_after, check_stale,
                          dict(self.phases))

    def restore(self, report: LoopReport) -> LoopReport:
        """Load the base weights back through the fence (a new version: the engine was someone else's)."""
        report.restored = self.sync.sync(self.settings.model_dir, version_before=report.version_after)
        return report

    def close(self) -> None:
        self.client.close()


def _torch() -> Any:
    import torch

    return torch


def _check(model: Any, records: list[list[dict[str, Any]]]) -> DeltaStats:
    """The trainer's logprobs of every policy token of the rollouts against the engine's, pooled."""
    rollout: list[float] = []
    trainer: list[float] = []
    from openenv_harness.trainer.verify import score_tokens

    for entries in records:
        for r in entries:
            md = r["metadata"]
            if md["call_kind"] != "agent" or md["status"] != "ok" or md.get("logprobs_are_policy") is False:
                continue
            rollout.extend(r["per_token_logps"])
            trainer.extend(score_tokens(model, r["prompt_token_ids"], r["completion_token_ids"]))
    if not rollout:
        raise RuntimeError("no policy token to check: every call was constrained or failed")
    return DeltaStats.of(rollout, trainer, DEFAULT_LIMITS.epsilon)


def _sharing_frozen(base: Any, layers: int) -> tuple[Any, list[Any]]:
    """A copy of ``base`` to train, and its trained parameters; its frozen parameters are ``base``'s own
    tensors (never written): two models for the memory of one and the trained layers."""
    policy = copy.deepcopy(base)
    trained = train_last_layers(policy, layers)
    shared = dict(base.named_parameters())
    for name, parameter in policy.named_parameters():
        if not parameter.requires_grad:
            parameter.data = shared[name].data
    return policy, trained


def _save_as_served(model: Any, trained: list[Any], folder: Path) -> None:
    """Round the trained parameters to bf16 in place -- the model then holds exactly the weights the engine
    loads -- and write them as bf16 safetensors (a tensor shared by two names, a tied embedding, stays one)."""
    torch = _torch()
    with torch.no_grad():
        for parameter in trained:
            parameter.copy_(parameter.to(torch.bfloat16))
    folder.mkdir(parents=True, exist_ok=True)
    converted: dict[int, Any] = {}
    state = {name: converted.setdefault(tensor.data_ptr(), tensor.to(torch.bfloat16))
             for name, tensor in model.state_dict().items()}
    model.save_pretrained(str(folder), state_dict=state, safe_serialization=True)


__all__ = ["LoopReport", "LoopSettings", "RolloutSummary", "TrainLoop", "shaped_reward", "trainable_view",
           "verify_records"]
