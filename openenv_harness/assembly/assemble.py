"""Build ``HarnessTrace`` samples from a session's records, one or more per chain.

Per chain, a sample starts with the first call's canonical prompt. Each call then contributes its
sampled ids verbatim (mask 1 with their rollout logprobs, or mask 0 when the record is not
trainable), followed by the *interstitial*: the tokens the next call's canonical prompt holds after
this call's reply (tool results, template glue), mask 0, logprob 0.0. Nothing is decoded or
re-encoded.

On an exact step the next prompt starts with previous prompt + sampled ids, so the interstitial
is the plain slice after them. That covers both endings: a reply that ended with the end-of-turn
id (the next prompt holds it inside the matched span) and one cut by ``length`` (the template's
end-of-turn and glue land in the interstitial, mask 0, since the model never sampled them).

On replay drift (the sampled ids did not come back verbatim) the strategy decides, fail closed:

- ``split`` (default): close the sample and start a new one from the next call's exact prompt.
  Every action keeps its gradient; the replayed history becomes context again.
- ``realign``: keep one sample by replacing the drifted reply with its canonical replay from the
  next prompt, as mask-0 context. That action loses its gradient. Gated like slime's
  ``fork_threshold``: only when the *incoming* call's completion is shorter than
  ``realign_max_tokens``; otherwise split.
- ``approximate`` (opt-in): splice anyway -- keep the sampled reply and continue with the next
  prompt after its first end-of-turn id past the previous prompt. The sample is labelled
  ``approximate``: later actions are trained on a context the engine never saw. Without an
  end-of-turn id, split.

Breaks start new chains; a sample never spans two chains (fork, keep both sides, no truncation).

Every segment carries its call's policy versions (start, end, whether it straddled a weight sync,
the engine's weight-version spans where recorded), and the sample the oldest start, the newest end
and whether any segment straddled: what a staleness filter reads (``openenv_harness/export``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, get_args

from openenv_harness.assembly.calls import Call, NonPolicy, Selection, check_non_policy, detect_eot, select_calls
from openenv_harness.assembly.chains import (
    Chain,
    ChainGrouping,
    Transition,
    group_chains,
)
from openenv_harness.assembly.diagnostics import (
    Resolutions,
    SessionStats,
    session_stats,
)
from openenv_harness.assembly.errors import AssemblyError
from openenv_harness.assembly.invariants import check_traces
from openenv_harness.assembly.trace import (
    EndedBy,
    HarnessTrace,
    Segment,
    Strategy,
    TraceMetadata,
)
from openenv_harness.contract import WeightVersionSpan

STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
#: slime's default realign gate on the incoming completion length.
DEFAULT_REALIGN_MAX_TOKENS = 1024


@dataclass(frozen=True, slots=True)
class AssembledSession:
    """Samples of one session with the evidence they were built from."""

    session_id: str | None
    strategy: Strategy
    calls: list[Call]
    chains: list[Chain]
    transitions: list[Transition]
    traces: list[HarnessTrace]
    stats: SessionStats
    eot_id: int | None


@dataclass(frozen=True, slots=True)
class _Options:
    """Per-session settings every sample of the session shares."""

    session_id: str | None
    strategy: Strategy
    eot_id: int | None
    realign_max_tokens: int
    reward: float | None


class _SampleBuilder:
    """Grows one sample; keeps ids, mask, logprobs and segments aligned as it goes."""

    def __init__(self, options: _Options, *, chain_id: int, sample_index: int, first: Call) -> None:
        self.options = options
        self.chain_id = chain_id
        self.sample_index = sample_index
        self.prompt = list(first.prompt)
        self.response: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.segments: list[Segment] = []
        self.node_ids: list[str] = []
        self.exact = 0
        self.realigned: list[str] = []
        self.spliced: list[str] = []
        self.lost_tokens = 0
        self.non_policy: list[str] = []
        self.add_call(first)

    def add_context(self, ids: Sequence[int]) -> None:
        self.response.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def add_call(self, call: Call) -> None:
        trainable = call.trainable_tokens
        self.segments.append(
            Segment(
                node_id=call.node_id, offset=len(self.response), length=len(call.completion), trainable_tokens=trainable,
                logprobs_are_policy=call.logprobs_are_policy, sampling=call.sampling, **_segment_versions(call),
            )
        )
        self.node_ids.append(call.node_id)
        if not call.logprobs_are_policy:
            self.non_policy.append(call.node_id)
        self.response.extend(call.completion)
        self.mask.extend(call.mask)
        self.logprobs.extend(call.logprobs)

    def continue_exact(self, prev: Call, call: Call) -> None:
        self.exact += 1
        self.add_context(call.prompt[len(prev.prompt) + len(prev.completion) :])
        self.add_call(call)

    def realign(self, prev: Call, call: Call) -> int:
        """Replace ``prev``'s reply by its canonical replay from the first differing id on (mask 0),
        keeping the exact prefix before it trainable; return the trainable ids lost.

        The kept prefix sits on exactly the context the engine sampled it from (``prev.prompt`` is a
        prefix of ``call.prompt``), so it trains like any exact token; only from the divergence on
        does the sample carry the replay the next call saw instead of what was sampled."""
        segment = self.segments.pop()
        if segment.node_id != prev.node_id:
            raise AssemblyError(f"internal: realign expected {prev.node_id} last, found {segment.node_id}")
        replay = call.prompt[len(prev.prompt) :]
        limit = min(len(prev.completion), len(replay))
        kept = 0
        while kept < limit and prev.completion[kept] == replay[kept]:
            kept += 1
        cut = segment.offset + kept
        del self.response[cut:]
        del self.mask[cut:]
        del self.logprobs[cut:]
        kept_trainable = sum(self.mask[segment.offset : cut])
        if kept:
            self.segments.append(segment.model_copy(update={
                "length": kept, "trainable_tokens": kept_trainable, "partial": True,
                "weight_versions": _clip_spans(segment.weight_versions, kept)}))
        self.realigned.append(prev.node_id)
        lost = segment.trainable_tokens - kept_trainable
        self.lost_tokens += lost
        self.add_context(replay[kept:])
        self.add_call(call)
        return lost

    def splice(self, prev: Call, call: Call, eot_position: int, eot_id: int) -> None:
        ends_with_eot = bool(prev.completion) and prev.completion[-1] == eot_id
        self.spliced.append(prev.node_id)
        self.add_context(call.prompt[eot_position + 1 if ends_with_eot else eot_position :])
        self.add_call(call)

    def build(self, ended_by: EndedBy) -> HarnessTrace:
        non_policy = [s for s in self.segments if not s.logprobs_are_policy]
        straddled = [s.node_id for s in self.segments if s.straddled_sync]
        metadata = TraceMetadata(
            session_id=self.options.session_id,
            chain_id=self.chain_id,
            sample_index=self.sample_index,
            strategy=self.options.strategy,
            node_ids=self.node_ids,
            segments=self.segments,
            exact=self.exact,
            realigned_node_ids=self.realigned,
            spliced_node_ids=self.spliced,
            lost_tokens=self.lost_tokens,
            non_policy_node_ids=[node for node in dict.fromkeys(self.non_policy) if node in self.node_ids],
            non_policy_tokens=sum(s.length for s in non_policy),
            non_policy_trainable_tokens=sum(s.trainable_tokens for s in non_policy),
            trainable_tokens=sum(self.mask),
            approximate=bool(self.spliced),
            ended_by=ended_by,
            eot_id=self.options.eot_id,
            policy_version_start=min(s.policy_version_start for s in self.segments),
            policy_version_end=max(s.policy_version_end for s in self.segments),
            straddled_sync=bool(straddled),
            straddled_node_ids=straddled,
        )
        return HarnessTrace(
            prompt_ids=self.prompt,
            response_ids=self.response,
            loss_mask=self.mask,
            response_logprobs=self.logprobs,
            reward=self.options.reward,
            metadata=metadata,
        )


def _segment_versions(call: Call) -> dict[str, Any]:
    """The call's policy versions as a segment carries them (``Segment``)."""
    v = call.versions
    return {"policy_version_start": v.policy_version_start, "policy_version_end": v.policy_version_end,
            "straddled_sync": v.straddled_sync, "weight_versions": v.weight_versions}


def _clip_spans(spans: list[WeightVersionSpan] | None, length: int) -> list[WeightVersionSpan] | None:
    """Weight-version spans cut to a partial segment's first ``length`` ids."""
    if spans is None:
        return None
    return [span.model_copy(update={"end": min(span.end, length)}) for span in spans if span.start < length]


def _eot_position(call: Call, start: int, eot_id: int | None) -> int | None:
    if eot_id is None:
        return None
    try:
        return call.prompt.index(eot_id, start)
    except ValueError:
        return None


def _assemble_chain(
    chain: Chain, transitions: Mapping[str, Transition], options: _Options, resolutions: Resolutions
) -> list[HarnessTrace]:
    traces: list[HarnessTrace] = []
    builder = _SampleBuilder(options, chain_id=chain.chain_id, sample_index=0, first=chain.calls[0])
    strategy, eot_id = options.strategy, options.eot_id

    for prev, call in pairwise(chain.calls):
        transition = transitions[call.node_id]
        if transition.kind == "exact":
            builder.continue_exact(prev, call)
            continue
        if strategy == "realign":
            if len(call.completion) < options.realign_max_tokens:
                resolutions.lost_tokens += builder.realign(prev, call)
                resolutions.realigned += 1
                continue
            resolutions.realign_gated += 1
        elif strategy == "approximate":
            eot_position = _eot_position(call, len(prev.prompt), eot_id)
            if eot_position is not None and eot_id is not None:
                builder.splice(prev, call, eot_position, eot_id)
                resolutions.spliced += 1
                continue
            resolutions.splice_fallback += 1
        else:
            resolutions.split += 1
        # Split: close this sample at prev's exact reply; the next one starts from call's exact prompt.
        traces.append(builder.build("replay_drift"))
        builder = _SampleBuilder(options, chain_id=chain.chain_id, sample_index=len(traces), first=call)
    traces.append(builder.build("chain_end"))
    return traces


def _check_options(strategy: str, eot_id: int | None, realign_max_tokens: int, reward: float | None,
                   non_policy: str = "mask") -> None:
    check_non_policy(non_policy)
    if strategy not in STRATEGIES:
        raise AssemblyError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if eot_id is not None and (isinstance(eot_id, bool) or not isinstance(eot_id, int) or eot_id < 0):
        raise AssemblyError(f"eot_id must be a non-negative integer or None, got {eot_id!r}")
    if isinstance(realign_max_tokens, bool) or not isinstance(realign_max_tokens, int) or realign_max_tokens < 0:
        raise AssemblyError(f"realign_max_tokens must be a non-negative integer, got {realign_max_tokens!r}")
    if reward is not None and (
        isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward)
    ):
        raise AssemblyError(f"reward must be a finite number or None (unscored), got {reward!r}")


def _assemble(
    selection: Selection,
    grouping: ChainGrouping,
    *,
    strategy: Strategy,
    eot_id: int | None,
    realign_max_tokens: int,
    reward: float | None,
) -> AssembledSession:
    resolved_eot = eot_id if eot_id is not None else detect_eot(selection.calls)
    by_node = {t.to_node: t for t in grouping.transitions}
    options = _Options(
        session_id=selection.session_id,
        strategy=strategy,
        eot_id=resolved_eot,
        realign_max_tokens=realign_max_tokens,
        reward=None if reward is None else float(reward),
    )
    resolutions = Resolutions()
    traces: list[HarnessTrace] = []
    for chain in grouping.chains:
        traces.extend(_assemble_chain(chain, by_node, options, resolutions))
    check_traces(traces, selection.calls)
    stats = session_stats(
        session_id=selection.session_id,
        strategy=strategy,
        calls=len(selection.calls),
        excluded=selection.excluded,
        grouping=grouping,
        traces=traces,
        resolutions=resolutions,
        eot_id=resolved_eot,
    )
    return AssembledSession(
        session_id=selection.session_id,
        strategy=strategy,
        calls=selection.calls,
        chains=grouping.chains,
        transitions=grouping.transitions,
        traces=traces,
        stats=stats,
        eot_id=resolved_eot,
    )


def assemble_session(
    entries: Iterable[Mapping[str, Any]],
    *,
    strategy: Strategy = "split",
    eot_id: int | None = None,
    realign_max_tokens: int = DEFAULT_REALIGN_MAX_TOKENS,
    reward: float | None = None,
    non_policy: NonPolicy = "mask",
) -> AssembledSession:
    """Assemble one session's records (``TraceEntry`` dicts) into checked ``HarnessTrace`` samples.

    ``eot_id`` None means auto-detect (last id of the first naturally stopped completion).
    ``reward`` is stamped on every sample; leave it None until the environment scored the rollout.
    ``non_policy``: sampled ids whose logprobs are not the policy's (a decoding constraint) get mask
    0 (``"mask"``, the default) or stay trainable, flagged (``"keep"``: the trainer recomputes the
    old logprobs); ``calls.py``.
    Raises ``AssemblyError`` on malformed records or when a built trace breaks an invariant.
    """
    _check_options(strategy, eot_id, realign_max_tokens, reward, non_policy)
    selection = select_calls(entries, non_policy=non_policy)
    grouping = group_chains(selection.calls)
    return _assemble(
        selection, grouping, strategy=strategy, eot_id=eot_id, realign_max_tokens=realign_max_tokens, reward=reward
    )


def compare_strategies(
    entries: Iterable[Mapping[str, Any]],
    *,
    eot_id: int | None = None,
    realign_max_tokens: int = DEFAULT_REALIGN_MAX_TOKENS,
    non_policy: NonPolicy = "mask",
) -> dict[Strategy, SessionStats]:
    """Assemble a session with every strategy; each ``SessionStats`` carries its trainable-token ratio."""
    _check_options("split", eot_id, realign_max_tokens, None, non_policy)
    selection = select_calls(entries, non_policy=non_policy)
    grouping = group_chains(selection.calls)
    return {
        strategy: _assemble(
            selection, grouping, strategy=strategy, eot_id=eot_id, realign_max_tokens=realign_max_tokens, reward=None
        ).stats
        for strategy in STRATEGIES
    }
