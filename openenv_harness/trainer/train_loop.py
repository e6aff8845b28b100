"""The RL loop closed on one machine: rollouts -> update -> weight sync through the fence -> rollouts.

What it proves, each step on the real parts (a real agent CLI, the recorder, a real vLLM, the
model in transformers):

1. a group of agent rollouts through the recorder in incremental mode, recorded at policy
   version ``v``; each assembled into rows (the project's assembler, and TRL's own
   ``_chain_to_sequences`` where TRL is installed: the two must give the same trainable tokens);
2. the records' sampling checked reproducible (``trainer/sampling.py``: temperature, truncation,
   penalties, the engine's logprobs mode), the trainer's logprobs of those rows against the
   engine's (the step-0 check at ``v``: ratio ~1, which measures this machine's bf16/fp32 noise
   floor), then one GRPO step on the fp32 master weights (``trainer/state.py``);
3. a bf16 copy of the new weights written to a folder and loaded into the running engine through
   the recorder's fence (``weight_sync.py``): pause, load, drop the prefix cache, bump the version,
   resume;
4. the next rollouts, whose records carry ``v + 1``; the new weights as served score them at the
   floor, and the weights before the step (a deliberately stale trainer) do not.

``TrainLoop.iterations(n)`` repeats it: the rollouts after one sync open the next iteration's
group, and every step starts from the previous step's fp32 masters and Adam state (never from the
bf16 copy the engine got). ``run()`` is one iteration.

The reward is the task's verdict plus a brevity bonus (``brevity``): a 0.5B model asked to fix a
file through an agent mostly answers in text and fails the task, and a group whose rewards tie
has no advantage to learn from. The bonus ranks the group so that one step moves the weights.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from openenv_harness.assembly import assemble_session
from openenv_harness.recorder.client import RecorderClient
from openenv_harness.rollout.report import run_rollout
from openenv_harness.rollout import BUILTIN_TASKS, Task
from openenv_harness.trainer.grpo import TrainSample, group_advantages
from openenv_harness.trainer.grpo import samples_from_traces
from openenv_harness.trainer.loop_report import LoopReport, RolloutSummary, StateTrace
from openenv_harness.trainer.sampling import REMEDY, TRAINING_POLICY, RecordedSampling, UnreproducibleSampling
from openenv_harness.trainer.sampling import require_reproducible
from openenv_harness.trainer.state import TrainerState, weights_digest
from openenv_harness.sandbox.choose import LOCAL_SANDBOX_LIMITS, sandbox_factory
from openenv_harness.trainer.limits import DEFAULT_LIMITS, DeltaStats
from openenv_harness.trainer.verify import load_model, verify_records
from openenv_harness.trainer.weight_sync import DiskWeightSync, SyncReport


#: Sampling from the whole distribution the trainer's log-softmax scores (``TRAINING_POLICY`` less its
#: temperature, which the loop's settings give): the model's generation config would otherwise truncate
#: it (Qwen2.5: top_p 0.8, top_k 20, repetition penalty 1.05), and the trainer cannot reproduce a
#: truncated or penalised distribution (``trainer/sampling.py`` refuses such records)
FULL_VOCABULARY: dict[str, Any] = {k: v for k, v in TRAINING_POLICY.items() if k != "temperature"}


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
    #: the norm weights' own learning rate (``TrainerState.create``); None: ``learning_rate``
    norm_learning_rate: float | None = None
    #: the most rollouts a group draws while its rewards tie (None: twice ``group``)
    max_group: int | None = None
    layers: int = 2
    brevity: float = 0.5
    max_agent_calls: int = 2
    rollout_timeout_s: float = 600.0
    #: a checkpoint (``TrainerState.save_checkpoint``) to start from instead of the model folder's weights
    resume_from: Path | None = None
    #: tasks as data (``rollout/task_data.py``): iteration i's group is ``tasks[(first_task + i) % len]``,
    #: its rollouts after the sync are the next task's first; None: the built-in ``task``, every iteration
    tasks: list[Task] | None = None
    first_task: int = 0
    #: appended to the agent's system prompt (``HarnessOptions.system_prompt_suffix``): the served model's
    #: tool-call hint, so the agent calls tools unconstrained
    system_prompt_suffix: str | None = None
    #: where the rollouts run (``sandbox/choose.py``): local (not isolated), docker, podman or hf
    sandbox: str = "local"
    #: the container image, with a container sandbox (None: the one ``./dev setup`` builds)
    image: str | None = None
    #: whose routes the engine serves (``trainer/engine_routes.py``): vllm or sglang
    engine_family: str = "vllm"


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
    """The loop against an engine behind a recorder: ``iterations(n)`` yields each iteration's report
    (after its sync and the rollouts that follow it), ``run()`` is one iteration. ``state`` is the
    trainer's (``TrainerState``) once the first step loaded it: a caller may checkpoint it between
    iterations."""

    def __init__(self, settings: LoopSettings, *, progress: Callable[[str], None] | None = None) -> None:
        if settings.group < 2:
            raise ValueError("a GRPO group needs at least 2 rollouts")
        if settings.max_group is not None and settings.max_group < settings.group:
            raise ValueError(f"max_group {settings.max_group} is smaller than the group ({settings.group})")
        if settings.tasks is not None and not settings.tasks:
            raise ValueError("the task list is empty")
        if settings.tasks is None and settings.task not in BUILTIN_TASKS:
            raise ValueError(f"unknown task {settings.task!r}; built-in tasks: {', '.join(sorted(BUILTIN_TASKS))}")
        if not (math.isfinite(settings.temperature) and settings.temperature > 0):
            raise ValueError(f"temperature {settings.temperature}: a policy gradient needs a sampling distribution "
                             "(temperature > 0)")
        self.settings = settings
        self.progress = progress or (lambda _m: None)
        self.sandbox_factory = sandbox_factory(settings.sandbox, settings.image)
        if settings.sandbox == "local":
            self.progress(f"note: {LOCAL_SANDBOX_LIMITS}")
        self.client = RecorderClient(settings.recorder_url, settings.admin_token)
        self.sync = DiskWeightSync(self.client, settings.engine_url, base_weights=settings.model_dir,
                                   family=settings.engine_family)
        self.phases: dict[str, float] = {}
        self.state: TrainerState | None = None
        self._traces: dict[str, list[Any]] = {}
        self._next_seed = settings.seed

    def _timed(self, name: str, fn: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return fn()
        finally:
            self.phases[name] = round(time.perf_counter() - started, 2)

    def refuse_unreproducible_policy(self) -> None:
        """Before any rollout: at a temperature other than 1 the engine must record the logprobs it
        sampled from (processed); raw ones are the model's before temperature, and a ratio against
        them is another policy's. The recorder's health says the engine's measured mode where it
        knows it; where it does not, every record's provenance is checked before the step."""
        s = self.settings
        if math.isclose(s.temperature, 1.0):
            return
        engine = self.client.health().get("engine")
        mode = engine.get("logprobs_mode") if isinstance(engine, dict) else None
        if mode == "raw_logprobs":
            raise UnreproducibleSampling(
                f"temperature {s.temperature:g} on an engine whose logprobs are raw (before temperature): the records "
                f"would carry another policy's logprobs. Sample at temperature 1, or {REMEDY}")
        if mode != "processed_logprobs":
            self.progress(f"the engine's logprobs mode is {mode or 'not reported'}: at temperature {s.temperature:g} "
                          "each record's is checked before the step")

    def task_for(self, iteration: int) -> Task:
        """The task of iteration ``iteration`` (0-based, counted from ``first_task``)."""
        s = self.settings
        if s.tasks is None:
            return BUILTIN_TASKS[s.task]
        return s.tasks[(s.first_task + iteration) % len(s.tasks)]

    def rollouts(self, count: int, first_seed: int, task: Task | None = None
                 ) -> tuple[list[RolloutSummary], list[list[dict[str, Any]]]]:
        """``count`` rollouts of ``task`` (the first iteration's by default), one after the other (seeds
        ``first_seed`` ...), and their records."""
        from openenv_harness.harnesses.base import HarnessOptions
        from openenv_harness.rollout import HarnessSessionFactory

        s = self.settings
        task = task or self.task_for(0)
        options = HarnessOptions(system_prompt_suffix=s.system_prompt_suffix) if s.system_prompt_suffix else None
        summaries: list[RolloutSummary] = []
        records: list[list[dict[str, Any]]] = []
        for seed in range(first_seed, first_seed + count):
            factory = HarnessSessionFactory(
                harness=s.harness, recorder_url=s.recorder_url, admin_token=s.admin_token, model=s.model,
                tasks={task.id: task}, prompt_mode="incremental", options=options,
                budgets={"max_agent_calls": s.max_agent_calls, "max_wall_clock_s": s.rollout_timeout_s},
                # the recorder's training sampling policy: the whole vocabulary at the loop's temperature on
                # every call, whatever the agent asks (its knobs are neutralised and recorded)
                sampling={"seed": seed, "max_tokens": s.max_tokens}, training_temperature=s.temperature,
                sandbox_factory=self.sandbox_factory)
            report, session = run_rollout(factory, task.id, timeout_s=s.rollout_timeout_s + 30, seed=seed)
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
                    None if theirs is None else theirs == ours, report.error, task=task.id))
                records.append(entries)
            finally:
                session.close()
            last = summaries[-1]
            self.progress(f"rollout {len(summaries)}/{count}: {last.calls} call(s), {last.sampled_tokens} sampled ids, "
                          f"task reward {last.task_reward}, reward {last.reward if last.reward is None else round(last.reward, 3)}, "
                          f"policy version {last.policy_versions}" + (f"; error: {last.error}" if last.error else ""))
        return summaries, records

    def _draw(self, count: int, task: Task) -> tuple[list[RolloutSummary], list[list[dict[str, Any]]]]:
        """``count`` rollouts of ``task`` on the next seeds: no two rollouts of a loop share one."""
        first, self._next_seed = self._next_seed, self._next_seed + count
        return self.rollouts(count, first, task)

    def _group(self, task: Task, carried: list[RolloutSummary], carried_records: list[list[dict[str, Any]]]
               ) -> tuple[list[RolloutSummary], list[list[dict[str, Any]]], list[tuple[RolloutSummary, Any]], list[float]]:
        """The group before the update: the rollouts already drawn at this version (the previous sync's),
        then new ones up to the group's size. A group whose rewards all tie carries no advantage: one more
        rollout is drawn at a time until the rewards rank, up to ``max_group`` (twice the group's size by
        default; then the step is a no-op, and the report says so)."""
        s = self.settings
        before, records = list(carried), list(carried_records)
        if len(before) < s.group:
            more, more_records = self._draw(s.group - len(before), task)
            before, records = before + more, records + more_records
        while True:
            scored = [(summary, recs) for summary, recs in zip(before, records) if summary.reward is not None]
            if len(scored) < 2:
                errors = sorted({r.error for r in before if r.reward is None and r.error})
                raise RuntimeError(f"{len(before) - len(scored)} of {len(before)} rollouts came back unscored, no "
                                   "group to learn from" + (f" ({'; '.join(errors)})" if errors else ""))
            advantages = group_advantages([summary.reward for summary, _ in scored])  # type: ignore[misc]
            if any(advantages) or len(before) >= (s.max_group or 2 * s.group):
                return before, records, scored, advantages
            self.progress("the group's rewards tie (no advantage): drawing one more rollout")
            more, more_records = self._draw(1, task)
            before, records = before + more, records + more_records

    def _samples(self, scored: list[tuple[RolloutSummary, Any]], advantages: list[float]) -> list[TrainSample]:
        """The group's rows, each scored at its records' temperature; records whose sampling the trainer
        cannot reproduce raise ``UnreproducibleSampling`` (before any model is loaded)."""
        samples: list[TrainSample] = []
        for (summary, entries), advantage in zip(scored, advantages):
            traces = self._traces[summary.session_id]
            nodes = {seg.node_id for t in traces for seg in t.metadata.segments if seg.trainable_tokens}
            sampling = require_reproducible(r for r in entries if r["metadata"].get("node_id") in nodes)
            samples.extend(samples_from_traces(traces, advantage, summary.session_id, sampling=sampling))
        return samples

    def _trainer(self) -> TrainerState:
        """The trainer's state, loaded once (fp32 masters), from a checkpoint where the settings name one."""
        if self.state is None:
            s = self.settings
            self.progress(f"loading the model from {s.model_dir} (trainer, float32)")
            model, _tokenizer = load_model(str(s.model_dir), dtype="float32")
            state = TrainerState.create(model, layers=s.layers, learning_rate=s.learning_rate,
                                        norm_learning_rate=s.norm_learning_rate)
            if s.resume_from is not None:
                state.load_checkpoint(s.resume_from)
                self.progress(f"resumed from {s.resume_from} at step {state.step}")
            self.state = state
        return self.state

    def serve_resumed(self) -> SyncReport:
        """Give the engine the resumed checkpoint's bf16 weights through the fence, before any rollout:
        the first group must be sampled by the policy the trainer resumes, not by the base weights."""
        state = self._trainer()
        folder = self.settings.workdir / f"policy-resumed-step{state.step}"
        state.save_served(folder)
        version = int(self.client.health()["fence"]["policy_version"])
        self.progress(f"loading the resumed weights ({folder}) into the engine through the recorder's fence")
        return self.sync.sync(folder, version_before=version)

    def iterations(self, steps: int = 1) -> Iterator[LoopReport]:
        """``steps`` iterations; the rollouts after each sync open the next iteration's group."""
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        s = self.settings
        self.refuse_unreproducible_policy()
        self._timed("check_engine", self.sync.check)
        version = int(self.client.health()["fence"]["policy_version"])  # a trainer may resume at any version
        carried: tuple[list[RolloutSummary], list[list[dict[str, Any]]]] = ([], [])
        for iteration in range(steps):
            task, next_task = self.task_for(iteration), self.task_for(iteration + 1)
            self.progress(f"rollouts at policy version {version}: {s.group} x {s.harness} on {task.id} (incremental mode)")
            before, before_records, scored, advantages = self._timed("rollouts_before",
                                                                     lambda: self._group(task, *carried))
            samples = self._samples(scored, advantages)
            state = self._timed("load_models", self._trainer) if self.state is None else self.state
            served_before = state.served_tensors()  # what the engine serves now (the base weights at first)
            with state.scoring_with(served_before) as model:
                check_before = self._timed("check_before", lambda: _check(model, before_records))
            self.progress(f"step-0 check at version {version}: mean |delta| {check_before.delta_mean:.4f} over "
                          f"{check_before.tokens} tokens (the noise floor)")
            master_before = state.master_digest()
            self.progress(f"GRPO step {state.step + 1}: {len(samples)} row(s), advantages {[round(a, 3) for a in advantages]}")
            step = self._timed("update", lambda: state.update(samples))
            served_after = state.served_tensors()
            weights = s.workdir / f"policy-v{version + 1}"
            self._timed("save_weights", lambda: state.save_served(weights))
            self.progress(f"syncing {weights} into the engine through the recorder's fence")
            sync = self._timed("weight_sync", lambda: self.sync.sync(weights, version_before=version))
            self.progress(f"engine reloaded in {sync.phases.get('load', 0):.1f} s; recorder at version {sync.version_after}")
            after, after_records = self._timed("rollouts_after", lambda: self._draw(s.next_rollouts, next_task))
            with state.scoring_with(served_after) as model:
                check_after = self._timed("check_after", lambda: _check(model, after_records))
            with state.scoring_with(served_before) as model:
                check_stale = self._timed("check_stale", lambda: _check(model, after_records))
            trace = StateTrace(state.step, state.adam_steps, master_before, state.master_digest(),
                               weights_digest(served_after), [name for name, tensor in served_after.items()
                                                              if not _torch().equal(tensor, served_before[name])])
            settings = asdict(s) | {"model_dir": str(s.model_dir), "workdir": str(s.workdir),
                                    "tasks": None if s.tasks is None else [t.id for t in s.tasks], "task": task.id}
            report = LoopReport(settings, version,
                                sync.version_after, before, step, sync, after, check_before, check_after, check_stale,
                                dict(self.phases), state=trace)
            self.phases = {}
            version, carried = sync.version_after, (after, after_records)
            yield report

    def run(self) -> LoopReport:
        """One iteration (``train-demo``)."""
        return list(self.iterations(1))[0]

    def restore(self, report: LoopReport | None = None) -> SyncReport | None:
        """Load the base weights back through the fence (a new version: the engine was someone else's),
        whatever a failed run left: a fence a sync left closed is recovered first. None when the engine
        holds the base weights already (the run failed before its sync, or its sync was rolled back)."""
        if self.sync.fence_closed:
            self.sync.recover()
        if self.sync.loaded == self.settings.model_dir.resolve():
            return None
        version = int(self.client.health()["fence"]["policy_version"])
        restored = self.sync.sync(self.settings.model_dir, version_before=version)
        if report is not None:
            report.restored = restored
        return restored

    def close(self) -> None:
        self.client.close()


def _check(model: Any, records: list[list[dict[str, Any]]]) -> DeltaStats:
    """The trainer's logprobs of every policy token of the rollouts against the engine's, pooled; each
    record scored at the temperature its logprobs were recorded under, a rollout's exact chain of calls
    in one forward pass (``verify.score_chained``)."""
    from openenv_harness.trainer.verify import score_chained

    rollout: list[float] = []
    trainer: list[float] = []
    for entries in records:
        policy = [r for r in entries if r["metadata"]["call_kind"] == "agent" and r["metadata"]["status"] == "ok"
                  and r["metadata"].get("logprobs_are_policy") is not False]
        scored = score_chained(model, [(r["prompt_token_ids"], r["completion_token_ids"],
                                        RecordedSampling.of(r).temperature_divisor) for r in policy])
        for r, scores in zip(policy, scored):
            rollout.extend(r["per_token_logps"])
            trainer.extend(scores)
    if not rollout:
        raise RuntimeError("no policy token to check: every call was constrained or failed")
    return DeltaStats.of(rollout, trainer, DEFAULT_LIMITS.epsilon)


def _torch() -> Any:
    import torch

    return torch


__all__ = ["FULL_VOCABULARY", "LoopReport", "LoopSettings", "RolloutSummary", "StateTrace", "TrainLoop",
           "shaped_reward", "trainable_view", "verify_records"]
