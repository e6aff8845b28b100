"""Feed recorded sessions into verifiers 0.4's message graph and read back its branches.

Why: a trainer built on verifiers (prime-rl) trains on ``Trace.branches``, one sample per
root-to-leaf path of verifiers' message graph. Our records already carry the engine's token
evidence, and verifiers' graph accepts it per call through the same step its interception server
takes after every model call: ``graph.prepare_turn(trace, messages, tools).commit(response)``
with ``response.tokens`` holding the prompt ids, sampled ids and logprobs. Nothing is decoded or
re-tokenized here; ids and logprobs go in verbatim.

This module imports only ``verifiers``, ``openenv_harness.contract`` and
``openenv_harness.assembly``. verifiers 0.4 pins ``mcp==2`` while OpenEnv needs ``mcp<2``, so it
runs in its own environment, next to neither OpenEnv nor the recorder.

How verifiers' grouping relates to ours (``assemble_session(..., strategy="split")``):

- verifiers walks the longest prefix of *message hashes*, then keeps a prefix node only while
  its token span equals the new prompt at that offset. Without a renderer's per-message spans
  (our case), every prompt token past the reused prefix lands on the assistant node, so a branch
  is exactly its last call's prompt + completion, with the earlier sampled ids marked as sampled.
- They agree on an exact step (one sample), on replay drift inside a message-equal prefix (the
  token check truncates the reuse, a new branch starts, like ``split``), and on breaks
  (compaction, sub-agents, re-samples: new branches, both sides kept).
- They differ when messages differ but tokens do not: a field the chat template never renders
  (tool-call ids, for instance) changes the message hash, so verifiers opens a new branch where
  our token-based chain continues exactly. No sampled token is lost; the history is repeated as
  context in the later samples. ``compare_with_assembly`` reports such cases.
- ``realign`` and ``approximate`` have no verifiers counterpart; compare against ``split``.

Selection follows the assembler: aux, failed and invalid records are left out (an aux call would
otherwise open a stray root of its own). A selected record whose sampled ids are not trainable
is committed with those ids unmasked (context, no logprob), as the assembler does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError
from verifiers.v1 import graph
from verifiers.v1.configs.agent import AgentConfig
from verifiers.v1.dialects.chat import ChatDialect
from verifiers.v1.episode import EnvInfo, Episode
from verifiers.v1.task import TaskData
from verifiers.v1.trace import AgentInfo, Branch, ModelCall, Reward, TimeSpan, Trace, TraceTask
from verifiers.v1.types import Response, Sampling, TurnTokens

from openenv_harness.assembly import AssembledSession, Call, select_calls
from openenv_harness.contract import is_training_entry

#: The trace task type recorded when the caller names none.
DEFAULT_TASK_TYPE = "OpenEnvHarnessSession"
#: The env id written on episodes built from recorded sessions.
DEFAULT_ENV_ID = "openenv-harness"
#: The reward name a session's ``verify()`` result is stored under.
DEFAULT_REWARD_NAME = "verify"
#: Our budget stop reasons, as verifiers names the same caps (``Trace.is_truncated`` reads them).
STOP_CONDITIONS: dict[str, str] = {
    "max_agent_calls": "max_turns",
    "max_calls": "max_turns",
    "max_prompt_tokens": "max_input_tokens",
    "max_completion_tokens": "max_output_tokens",
    "max_total_tokens": "max_total_tokens",
    "max_wall_clock_s": "agent_timeout",
}


class VerifiersIntegrationError(ValueError):
    """A record verifiers cannot take, named by its ``node_id``."""


def _node_id(entry: Mapping[str, Any]) -> str:
    metadata = entry.get("metadata")
    node_id = metadata.get("node_id") if isinstance(metadata, Mapping) else None
    return node_id if isinstance(node_id, str) and node_id else "<record without node_id>"


def response_from_record(entry: Mapping[str, Any], call: Call, dialect: ChatDialect) -> Response:
    """verifiers' ``Response`` for one record: its parsed reply plus the engine's token evidence."""
    raw = entry.get("response")
    if not isinstance(raw, Mapping):
        raise VerifiersIntegrationError(f"{call.node_id}: record has no response object")
    try:
        parsed = dialect.parse_response(dialect.validate_response(dict(raw)))
    except (ValidationError, IndexError, KeyError, TypeError) as exc:
        raise VerifiersIntegrationError(
            f"{call.node_id}: response is not an OpenAI chat.completion verifiers accepts: {exc}"
        ) from exc
    tokens = TurnTokens(prompt_ids=call.prompt, completion_ids=call.completion, completion_logprobs=call.logprobs)
    return parsed.model_copy(update={"tokens": tokens})


def _sampling(dialect: ChatDialect, request: Mapping[str, Any]) -> Sampling | None:
    try:
        return dialect.parse_sampling(dict(request))
    except ValidationError:
        return None


def _time_span(metadata: Mapping[str, Any]) -> TimeSpan:
    start = metadata.get("received_at")
    upstream_ms = metadata.get("upstream_ms")
    if not isinstance(start, (int, float)) or isinstance(start, bool):
        return TimeSpan()
    duration = upstream_ms / 1000.0 if isinstance(upstream_ms, (int, float)) and upstream_ms > 0 else 0.0
    return TimeSpan(start=float(start), end=float(start) + duration)


def _unmask_untrainable(trace: Trace, node_id: int, call: Call) -> None:
    """Turn sampled ids the record does not train into context on the committed node."""
    if all(call.mask):
        return
    node = trace.nodes[node_id]
    generation_prompt = len(node.token_ids) - len(call.completion)
    node.mask = [False] * generation_prompt + [bool(flag) for flag in call.mask]
    node.logprobs = [logprob for logprob, flag in zip(call.logprobs, call.mask, strict=True) if flag]


def commit_record(trace: Trace, entry: Mapping[str, Any], call: Call, dialect: ChatDialect | None = None) -> int:
    """Commit one selected record into ``trace``'s graph; return the assistant node's index.

    ``call`` is the record as the assembler read it (``assembly.call_from_entry``), so ids, mask
    and logprobs are the checked ones. Records a ``ModelCall`` the way verifiers' interception does.
    """
    dialect = dialect or ChatDialect()
    request = entry.get("request")
    if not isinstance(request, Mapping):
        raise VerifiersIntegrationError(f"{call.node_id}: record has no request object")
    try:
        parsed_request = dialect.parse_request(dict(request))
    except (ValidationError, ValueError, KeyError, TypeError) as exc:
        raise VerifiersIntegrationError(f"{call.node_id}: request messages do not parse as chat: {exc}") from exc
    response = response_from_record(entry, call, dialect)
    node = graph.prepare_turn(trace, parsed_request.messages, parsed_request.tools).commit(response)
    _unmask_untrainable(trace, node, call)
    metadata = entry.get("metadata") or {}
    trace.calls.append(
        ModelCall(
            node=node,
            model=request.get("model"),
            sampling=_sampling(dialect, request),
            endpoint=dialect.upstream_path,
            finish_reason=response.finish_reason,
            usage=response.usage,
            time=_time_span(metadata),
        )
    )
    return node


def _stop_condition(entries: Sequence[Mapping[str, Any]]) -> str:
    for entry in reversed(entries):
        limits = (entry.get("metadata") or {}).get("limits") or {}
        stop = limits.get("stop") if isinstance(limits, Mapping) else None
        if isinstance(stop, str) and stop:
            return STOP_CONDITIONS.get(stop, stop)
    return "agent_completed"


def records_to_trace(
    entries: Iterable[Mapping[str, Any]],
    *,
    reward: float | None = None,
    reward_name: str = DEFAULT_REWARD_NAME,
    task_type: str = DEFAULT_TASK_TYPE,
    task_data: TaskData | None = None,
    agent_config: AgentConfig | None = None,
) -> Trace:
    """One session's records as a completed verifiers ``Trace`` (its ``branches`` are the samples).

    ``reward`` is the environment's ``verify()`` result; None (unscored) is stored as
    ``trace.rewards[reward_name] = None``, verifiers' own "scoring did not run" marker. Note that
    verifiers' ``Trace.reward`` sums only scored rewards, so it reads 0.0 for an unscored trace:
    check ``trace.rewards`` before training on it. A session without usable agent calls gives a
    trace without branches. Raises ``AssemblyError`` for malformed records (the assembler's checks)
    and ``VerifiersIntegrationError`` for records verifiers cannot parse or a reward that is no number.
    """
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward)
    ):
        raise VerifiersIntegrationError(f"reward must be a finite number or None (unscored), got {reward!r}")
    records = list(entries)
    selection = select_calls(records)
    by_node = {_node_id(entry): entry for entry in records if is_training_entry(dict(entry))}
    data = task_data if task_data is not None else TaskData(id=selection.session_id)
    trace: Trace = Trace(
        task=TraceTask(type=task_type, data=data),
        agent=AgentInfo(config=agent_config if agent_config is not None else AgentConfig()),
    )
    dialect = ChatDialect()
    for call in selection.calls:
        commit_record(trace, by_node[call.node_id], call, dialect)
    trace.rewards[reward_name] = None if reward is None else Reward(score=float(reward))
    trace.info["openenv_harness"] = {
        "session_id": selection.session_id,
        "node_ids": [call.node_id for call in selection.calls],
        "excluded": selection.excluded,
    }
    trace.ok = True
    trace.stop(_stop_condition(records))
    return trace


def session_episode(trace: Trace, *, env_id: str = DEFAULT_ENV_ID) -> Episode:
    """The trace as verifiers' unit of saved work (one line of a ``traces.jsonl``)."""
    return Episode(env=EnvInfo(id=env_id), task=trace.task, ok=trace.ok, traces=[trace])


class BranchSample(BaseModel):
    """One verifiers branch as plain data: what a verifiers trainer receives for it."""

    index: int
    token_ids: list[int]
    sampled_mask: list[int]
    logprobs: list[float]
    trainable: bool

    @property
    def sampled_tokens(self) -> int:
        return sum(self.sampled_mask)


def branch_sample(branch: Branch) -> BranchSample:
    return BranchSample(
        index=branch.index,
        token_ids=branch.token_ids,
        sampled_mask=[int(flag) for flag in branch.sampled_mask],
        logprobs=branch.logprobs,
        trainable=branch.trainable,
    )


class BranchMatch(BaseModel):
    branch: int
    trace: int


class BranchComparison(BaseModel):
    """How verifiers' branches line up with the assembler's samples of the same records.

    A match means identical token ids, sampled mask and logprobs. Unmatched entries list indices
    into ``trace.branches`` and ``assembled.traces``.
    """

    branches: int
    traces: int
    matched: list[BranchMatch]
    unmatched_branches: list[int]
    unmatched_traces: list[int]
    branch_sampled_tokens: int
    trace_trainable_tokens: int

    @property
    def identical(self) -> bool:
        return not self.unmatched_branches and not self.unmatched_traces


def compare_with_assembly(trace: Trace, assembled: AssembledSession) -> BranchComparison:
    """Pair each branch of ``trace`` with the assembled sample holding the same tokens, mask, logprobs."""
    samples = [branch_sample(branch) for branch in trace.branches]
    expected = [
        (
            t.prompt_ids + t.response_ids,
            [0] * len(t.prompt_ids) + t.loss_mask,
            [0.0] * len(t.prompt_ids) + t.response_logprobs,
        )
        for t in assembled.traces
    ]
    matched: list[BranchMatch] = []
    free = set(range(len(expected)))
    for sample in samples:
        found = next(
            (
                i
                for i in sorted(free)
                if expected[i] == (sample.token_ids, sample.sampled_mask, sample.logprobs)
            ),
            None,
        )
        if found is not None:
            free.discard(found)
            matched.append(BranchMatch(branch=sample.index, trace=found))
    paired = {m.branch for m in matched}
    return BranchComparison(
        branches=len(samples),
        traces=len(expected),
        matched=matched,
        unmatched_branches=[s.index for s in samples if s.index not in paired],
        unmatched_traces=sorted(free),
        branch_sampled_tokens=sum(s.sampled_tokens for s in samples),
        trace_trainable_tokens=sum(t.metadata.trainable_tokens for t in assembled.traces),
    )
