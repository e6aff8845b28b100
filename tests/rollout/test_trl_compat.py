"""TRL 1.16's own harness loop and reconciler, fed with real Pi and OpenCode rollouts.

Every rollout here goes through TRL's ``_HarnessRolloutLoop._run_session`` exactly as its worker
runs it in loop-owning mode: TRL calls our ``TRLSessionFactory`` with its training sampling,
creates a session per rollout, waits for the real agent CLI, reads ``fetch_training_trace()``,
maps it with its own ``_turns_from_training_trace`` and reconciles it with ``_chain_to_sequences``
(fork threshold 0). The assertions compare what TRL trains with what the reference engine
sampled and what the recorder recorded. Only the loop's constructor is bypassed: TRL's
``HarnessRolloutWorker`` demands vLLM, so the loop is built directly with the multiprocessing
handles set to ``None`` -- they are used only by the worker's generate/score loops, not here.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import pytest
from openenv.core.harness import TrainingTrace

from openenv_harness.recorder import RecorderClient, RecorderServer
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSession, HarnessSessionFactory, TRLSessionFactory
from openenv_harness.rollout.taskset import script_for
from openenv_harness.testing.engine import (
    EngineServer, Fault, Script, ToolCallSpec, Turn, is_noncanonical, reference_tokenizer,
)

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytest.importorskip("trl")
from trl.experimental.async_grpo.async_rollout_worker import RolloutGroup, _chain_to_sequences  # noqa: E402
from trl.experimental.async_grpo.openenv_harness import _HarnessRolloutLoop, _turns_from_training_trace  # noqa: E402

pytestmark = [pytest.mark.compat, pytest.mark.cli]

HARNESSES = ["pi", pytest.param("opencode", marks=pytest.mark.slow)]  # an OpenCode run takes ~5 s
#: plus the agents that speak the Responses (Codex) and Messages (Claude Code) dialects
ALL_HARNESSES = [*HARNESSES, "codex", pytest.param("claude-code", marks=pytest.mark.slow)]
TASK = BUILTIN_TASKS["fix-add"]
PROMPT = [{"role": "user", "content": TASK.id}]  # a dataset row's prompt, as TRL passes it
TEMPERATURE = 0.7
SCRIPTS: dict[str, Script] = {
    "canonical": Script(turns=TASK.reference_script),
    "noncanonical": Script(turns=TASK.reference_script, segmentation="noncanonical"),
    # the model emits compact JSON; vLLM re-renders the agent's replay of it with tojson's spaces: drift on
    # the first transition only
    "rewritten": Script(turns=[Turn(tool_calls=[ToolCallSpec(name="bash", arguments='{"command":"cat calc.py"}')]),
                               *TASK.reference_script[1:]]),
    "unsolved": Script(turns=[Turn(content="I could not find the bug.")]),
}
DRIFTED = ("replay_drift", "break")


@pytest.fixture(scope="module", autouse=True)
def accelerate_state() -> None:
    from accelerate.state import PartialState

    PartialState()  # TRL's loop logs through accelerate, which needs an initialised state


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """An offline tokenizer for the loop's constructor (TRL never renders in loop-owning mode).

    The reference engine's vocabulary, with TRL's Qwen3 template: the constructor accepts only
    templates TRL knows (it attaches a response schema to them).
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen3_chat_template

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(reference_tokenizer().to_json()),
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = qwen3_chat_template
    return tok


def make_loop(tokenizer: Any, factory: Callable[..., Any]) -> _HarnessRolloutLoop:
    from datasets import Dataset

    return _HarnessRolloutLoop(
        harness_session_factory=factory, model_name="reference-model",
        dataset=Dataset.from_dict({"prompt": [PROMPT]}), reward_funcs=[], processing_class=tokenizer,
        eos_token_ids=[reference_tokenizer().im_end_id], rollout_buffer=None, model_version_value=None,
        heartbeat_value=None, failed_event=None, exception_info_queue=None, metrics_queue=None,
        temperature=TEMPERATURE, num_generations=3,
    )


def close_loop(loop: _HarnessRolloutLoop) -> None:
    loop._session_pool.shutdown(wait=True)
    loop._tool_pool.shutdown(wait=True)
    loop._loop.close()


@dataclass
class Rollout:
    """One ``_run_session`` and everything the engine and the recorder saw of it."""

    model: str
    group_id: int
    result: tuple  # (completion, completion_ids, sequences, tool_call_count, tool_failure_count, reward)
    metrics: dict[str, Any] | None
    session: dict[str, Any] | None
    trace: TrainingTrace | None
    agent_requests: list[dict[str, Any]]  # engine-side: body and what was sampled

    @property
    def sequences(self) -> list:
        return self.result[2]

    @property
    def reward(self) -> float | None:
        return self.result[5]

    @property
    def fidelity(self) -> list[str]:
        assert self.trace is not None
        return [t.metadata["fidelity"]["class"] for t in self.trace.turns]


class Rollouts:
    """Runs and caches rollouts for the module: each one is read by several tests."""

    def __init__(self, engine: EngineServer, recorder: RecorderServer, tokenizer: Any) -> None:
        self.engine, self.recorder, self.tokenizer = engine, recorder, tokenizer
        self.admin = RecorderClient(recorder.url, recorder.admin_token)
        self._cache: dict[tuple[str, str], Rollout] = {}
        self._group_ids = itertools.count(100)

    def get(self, harness: str, label: str, *, script: Script | None = None, faults: tuple[Fault, ...] = (),
            factory: Callable[..., Callable[..., Any]] | None = None, **factory_kw: Any) -> Rollout:
        if (harness, label) not in self._cache:
            model = f"trl-{harness}-{label}"
            chosen = script or SCRIPTS[label]  # written for the agent's own shell tool
            self.engine.set_script(model, Script.model_validate({**chosen.model_dump(),
                                                                 "turns": script_for(chosen.turns, harness)}))
            for fault in faults:
                self.engine.add_fault(model, fault)
            make = factory or (lambda **kw: TRLSessionFactory(harness=harness, **kw))
            loop = make_loop(self.tokenizer, make(recorder_url=self.recorder.url,
                                                  admin_token=self.recorder.admin_token, model=model, **factory_kw))
            group_id = next(self._group_ids)
            try:
                result, metrics = loop._run_session(PROMPT, group_id)
            finally:
                close_loop(loop)
            self._cache[(harness, label)] = self._read_back(model, group_id, result, metrics)
        return self._cache[(harness, label)]

    def _read_back(self, model: str, group_id: int, result: tuple, metrics: dict | None) -> Rollout:
        found = [s for s in self.admin.sessions() if s["metadata"].get("seed") == group_id]
        session = found[0] if found else None
        trace = None
        if session is not None:  # what fetch_training_trace() returned, read again from the recorder
            trace = TrainingTrace.model_validate(self.admin.training_trace_json(session["session_id"]))
        # agent calls: chat calls with tools, and (incremental mode) the exact-id generate calls
        requests = [r for r in self.engine.requests(model) if "sampled" in r
                    and (r["body"].get("tools") or r["path"] == "/inference/v1/generate")]
        return Rollout(model, group_id, result, metrics, session, trace, requests)

    def close(self) -> None:
        self.admin.close()


@pytest.fixture(scope="module")
def rollouts(cli_paths, engine: EngineServer, recorder: RecorderServer, tokenizer: Any):
    runs = Rollouts(engine, recorder, tokenizer)
    yield runs
    runs.close()


def assert_rows_cover_turns_once(rows: list, groups: list[list], requests: list[dict[str, Any]]) -> None:
    """Each row is one run of turns that extend each other; every sampled token is trained once,
    on exactly the context the model saw, with the engine's logprob."""
    sampled = [r["sampled"] for r in requests]
    assert len(rows) == len(groups)
    turns = [t for g in groups for t in g]
    assert [t.output_ids for t in turns] == [s["token_ids"] for s in sampled]
    assert [t.prompt_ids for t in turns] == [s["prompt_token_ids"] for s in sampled]
    for row, group in zip(rows, groups):
        assert row.input_ids == group[-1].prompt_ids + group[-1].output_ids
        trained: list[int] = []
        for turn in group:
            start, end = len(turn.prompt_ids), len(turn.prompt_ids) + len(turn.output_ids)
            assert row.input_ids[:start] == turn.prompt_ids  # never merged onto unseen context
            assert row.input_ids[start:end] == turn.output_ids
            trained.extend(range(start, end))
        assert [i for i, m in enumerate(row.completion_mask) if m == 1] == trained
        logps = {i: row.old_log_probs[i] for i in trained}
        expected = [lp for turn in group for lp in turn.output_log_probs]
        assert [logps[i] for i in trained] == expected
        assert all(row.old_log_probs[i] == 0.0 for i in range(len(row.input_ids)) if i not in logps)
    assert sum(sum(r.completion_mask) for r in rows) == sum(len(t.output_ids) for t in turns)
    flat = [lp for t in turns for lp in t.output_log_probs]
    assert flat == [lp for s in sampled for lp in s["logprobs"]]  # generation-time logprobs, verbatim


# -- 1. canonical sampling, byte-identical replay: one CLEAN chain, one row ---------------------------------


@pytest.mark.parametrize("harness", ALL_HARNESSES)
def test_canonical_rollout_is_one_clean_training_row(harness: str, rollouts: Rollouts) -> None:
    run = rollouts.get(harness, "canonical")
    assert run.reward == 1.0
    assert run.fidelity == ["root", "exact", "exact", "exact"]
    turns = _turns_from_training_trace(run.trace)  # TRL's own mapping of what fetch_training_trace() gave it
    assert all(t.output_mask == [1] * len(t.output_ids) for t in turns)
    rows, tally = _chain_to_sequences(turns, "replayed", 0)
    assert tally == {"clean": 3.0, "realign": 0.0, "fork": 0.0, "transitions": 3.0, "drift_tokens": 0.0,
                     "drift_max": 0.0}
    assert len(rows) == 1
    assert rows[0].input_ids == turns[-1].prompt_ids + turns[-1].output_ids
    assert_rows_cover_turns_once(rows, [turns], run.agent_requests)
    # the loop trained the very same row
    assert [(s.input_ids, s.completion_mask, s.old_log_probs) for s in run.sequences] == [
        (rows[0].input_ids, rows[0].completion_mask, rows[0].old_log_probs)]
    assert run.metrics["tally"] == tally


# -- 2. drift: TRL forks where the recorder saw drift, and trains every sampled token once ------------------


@pytest.mark.parametrize("label", ["noncanonical", "rewritten"])
@pytest.mark.parametrize("harness", HARNESSES)
def test_drift_forks_exactly_where_the_recorder_saw_it(harness: str, label: str, rollouts: Rollouts) -> None:
    run = rollouts.get(harness, label)
    assert run.reward == 1.0
    turns = _turns_from_training_trace(run.trace)
    first = run.agent_requests[0]["sampled"]["token_ids"]
    if label == "noncanonical":
        assert is_noncanonical(reference_tokenizer(), first)
        assert run.fidelity == ["root"] + ["replay_drift"] * 3
    else:
        assert '{"command":"cat calc.py"}' in reference_tokenizer().decode(first)
        assert run.fidelity == ["root", "replay_drift", "exact", "exact"]
    tally = run.metrics["tally"]  # TRL's own count, from its loop-owning run (threshold 0)
    drifted = sum(c in DRIFTED for c in run.fidelity)
    assert tally["fork"] == drifted and tally["realign"] == 0.0
    assert tally["clean"] == run.fidelity.count("exact")
    groups: list[list] = []
    for turn, cls in zip(turns, run.fidelity):
        if cls in ("root", *DRIFTED):
            groups.append([])
        groups[-1].append(turn)
    rows = run.sequences
    assert_rows_cover_turns_once(rows, groups, run.agent_requests)
    # a positive threshold would have realigned instead, masking sampled tokens out of training
    realigned, realign_tally = _chain_to_sequences(turns, "threshold", 1024)
    assert realign_tally["realign"] == drifted and realign_tally["fork"] == 0.0
    assert sum(sum(r.completion_mask) for r in realigned) < sum(len(t.output_ids) for t in turns)


# -- 3. TRL's loop-owning path end to end ---------------------------------------------------------------------


@pytest.mark.parametrize("harness", ALL_HARNESSES)
def test_run_session_returns_the_rollout_trl_trains(harness: str, rollouts: Rollouts) -> None:
    run = rollouts.get(harness, "canonical")
    completion, completion_ids, sequences, tool_calls, tool_failures, reward = run.result
    assert reward == 1.0  # our verify(): the task's own tests pass in the sandbox
    assert completion_ids == [i for r in run.agent_requests for i in r["sampled"]["token_ids"]]
    assert len(sequences) == 1 and run.metrics["sequences"] == 1 and run.metrics["turns"] == 4
    assert (tool_calls, tool_failures) == (3, 0)
    assert completion[-1] == {"role": "assistant", "content": TASK.reference_script[-1]["content"]}
    assert any(m["role"] == "user" and TASK.instruction in str(m["content"]) for m in completion)
    assert run.metrics["loop_exhausted"] is False
    # TRL's training sampling reached the engine on every call, and the recorder's provenance says so
    pinned = {"temperature": TEMPERATURE, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0,
              "presence_penalty": 0.0, "repetition_penalty": 1.0}
    for request in run.agent_requests:
        assert {k: request["body"].get(k) for k in pinned} == pinned
        assert request["body"]["return_token_ids"] is True and request["body"]["logprobs"] is True
    for turn in run.trace.turns:
        assert {k: turn.metadata["provenance"]["sampling"][k] for k in pinned} == pinned
    # the group id became the session's seed, so every generation of a group gets the same task
    assert run.session["metadata"]["seed"] == run.group_id and run.session["metadata"]["task_id"] == TASK.id
    assert run.session["status"] == "closed" and run.session["harness"] == harness


def test_score_group_gives_one_normalised_advantage_per_rollout(rollouts: Rollouts, tokenizer: Any) -> None:
    solved = rollouts.get("pi", "canonical")
    unsolved = rollouts.get("pi", "unsolved")
    unscorable = rollouts.get("pi", "template-mismatch", script=SCRIPTS["canonical"],
                              trainer_template_fingerprint="tpl1-" + "0" * 64)
    assert (solved.reward, unsolved.reward, unscorable.reward) == (1.0, 0.0, None)
    group = RolloutGroup(prompts=[], reward_kwargs={}, completions=[], completions_ids=[], completions_sequences=[],
                         tool_call_counts=[], tool_failure_counts=[], model_version=3, group_id=42, env_rewards=[],
                         rollout_rewards=[])
    for run in (solved, unsolved, unscorable):  # what TRL's generate loop appends per finished rollout
        completion, completion_ids, sequences, tool_calls, tool_failures, reward = run.result
        group.prompts.append(PROMPT)
        group.completions.append(completion)
        group.completions_ids.append(completion_ids)
        group.completions_sequences.append(sequences)
        group.tool_call_counts.append(tool_calls)
        group.tool_failure_counts.append(tool_failures)
        group.rollout_rewards.append(reward)
    loop = make_loop(tokenizer, TRLSessionFactory(harness="pi", recorder_url=rollouts.recorder.url,
                                                  admin_token=rollouts.recorder.admin_token, model="unused"))
    try:
        samples = asyncio.run(loop._score_group(group))
    finally:
        close_loop(loop)
    assert len(samples) == 2  # one row each; the unscorable rollout has none
    assert [s.advantage for s in samples] == pytest.approx([1.0, -1.0], abs=1e-6)
    for sample, run in zip(samples, (solved, unsolved)):
        row = run.sequences[0]
        assert sample.input_ids.dtype.name == "int64" and sample.input_ids.tolist() == row.input_ids
        assert sample.completion_mask.tolist() == row.completion_mask
        assert sample.old_log_probs.dtype.name == "float32"
        assert sample.old_log_probs.tolist() == pytest.approx(row.old_log_probs, abs=1e-6)
        assert (sample.model_version, sample.group_id) == (3, 42)
        assert sample.metrics["reward"] == run.reward


# -- 3b. failures: unscorable or partially trained, never a capture-contract error --------------------------


class _DeadlineSession(HarnessSession):
    """TRL calls ``wait_for_completion()`` with no timeout; this session's deadline expires at a
    chosen moment (``expire`` returns then), after which the agent gets a short grace period."""

    def __init__(self, inner: HarnessSession, expire: Callable[[], None]) -> None:
        super().__init__(task=inner.task, agent=inner.agent, client=inner.client, close_client=True)
        self._expire = expire

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        self._expire()
        return super().wait_for_completion(timeout_s=0.2)


class _DeadlineFactory(HarnessSessionFactory):
    def __init__(self, expire: Callable[[], None], **kw: Any) -> None:
        super().__init__(**kw)
        self._expire = expire

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> HarnessSession:
        return _DeadlineSession(super().create(task, seed=seed, episode_id=episode_id), self._expire)


def test_a_timed_out_agent_still_trains_its_captured_turns(rollouts: Rollouts) -> None:
    model = "trl-pi-deadline"

    def third_call_pending() -> None:  # the agent has run cat and sed, and waits on its third model call
        deadline = time.monotonic() + 60
        while len([r for r in rollouts.engine.requests(model) if r["body"].get("tools")]) < 3:
            assert time.monotonic() < deadline, "the agent never reached its third call"
            time.sleep(0.05)

    def factory(**kw: Any) -> Callable[..., HarnessSessionFactory]:
        return lambda sampling=None: _DeadlineFactory(third_call_pending, harness="pi", sampling=sampling, **kw)

    hang = Fault(latency_s=3.0, on_turn=2, agent_only=True)
    run = rollouts.get("pi", "deadline", script=SCRIPTS["canonical"], faults=(hang,), factory=factory)
    assert run.metrics["loop_exhausted"] is True  # TRL's timed_out flag
    assert run.fidelity == ["root", "exact"]
    sampled = run.agent_requests[:2]
    assert run.result[1] == [i for r in sampled for i in r["sampled"]["token_ids"]]
    turns = _turns_from_training_trace(run.trace)
    assert_rows_cover_turns_once(run.sequences, [turns], sampled)
    assert run.reward == 1.0  # the fix landed before the deadline; the environment scores the final state


def test_a_session_that_cannot_start_is_an_unscorable_rollout(rollouts: Rollouts) -> None:
    run = rollouts.get("pi", "template-mismatch", script=SCRIPTS["canonical"],
                       trainer_template_fingerprint="tpl1-" + "0" * 64)
    assert run.result == ([], [], [], 0, 0, None) and run.metrics is None  # TRL's empty rollout
    assert run.session is None  # the recorder refused the session: served template != trainer's
    assert rollouts.engine.requests(run.model) == []  # no agent ever ran


def _engine_400(rollouts: Rollouts) -> Rollout:
    fault = Fault(status=400, message="prompt too long for this engine", on_turn=1, count=1)
    return rollouts.get("pi", "engine-400", script=SCRIPTS["canonical"], faults=(fault,))


def test_an_engine_error_mid_run_trains_only_what_was_sampled(rollouts: Rollouts) -> None:
    run = _engine_400(rollouts)  # a CaptureContractError would have propagated out of _run_session
    assert run.session["last_error"]["status"] == 400
    assert len(run.trace.turns) == 1  # the failed call carries no tokens and is not in the trace
    first = run.agent_requests[0]["sampled"]
    assert run.result[1] == first["token_ids"]
    assert [s.input_ids for s in run.sequences] == [first["prompt_token_ids"] + first["token_ids"]]
    assert run.reward != 1.0


def test_an_engine_error_mid_run_is_unscored(rollouts: Rollouts) -> None:
    assert _engine_400(rollouts).reward is None
