"""Group a session's agent calls into chains, and classify every step between calls.

Why canonical prompts only: a call's sampled ids (``[fish, ing]``) can come back inside the next
prompt re-tokenized (``[fishing]``), so comparing sampled ids with prompts would break chains that
are in fact continuous. Prompts are the engine's own tokenization of what the agent sent, so
prompt-against-prompt comparison is exact.

Grouping rule: call k joins the chain whose last prompt (its *tip*) is a proper token prefix of
call k's prompt; the longest such tip wins (ties: the chain created first). Otherwise call k
starts a new chain -- a *break* -- and both sides are kept. An identical prompt never continues a
chain: a continuation always adds at least the previous reply, so a repeat is a re-sample.

Transitions (a diagnostic, not a verdict):

- ``exact``: the next prompt starts with the previous prompt + its sampled ids.
- ``replay_drift``: the next prompt starts with the previous prompt, but the sampled ids did not
  come back verbatim (re-tokenized, re-serialized, stripped). ``divergence`` is the first prompt
  position that differs from previous prompt + sampled ids; ``drift_tokens`` how many sampled ids
  were not reproduced.
- ``break``: the call starts a new chain while another exists. ``from_node`` is the earlier call
  whose prompt shares the longest prefix with it, ``divergence`` that shared length, and
  ``cause`` the first matching rule, in this order:

  1. ``resample``: the prompt equals an earlier prompt (a retry or a sibling sample).
  2. ``retokenized_tail``: the divergence lies in the best match's last turn, i.e. at or after
     the prompt of its predecessor in its chain (a template or harness re-rendered recent turns).
  3. short share (at most ``SHORT_SHARE`` of the best match's prompt, e.g. only the system
     prompt): ``sub_agent`` when the best match's chain receives calls after this one (both
     lineages go on), else ``history_rewrite`` (compaction: the old lineage ends).
  4. ``unknown``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from openenv_harness.assembly.calls import Call
from openenv_harness.assembly.tokens import WIDTH, common_prefix_tokens, starts_with_at

TransitionKind = Literal["exact", "replay_drift", "break"]
BreakCause = Literal["resample", "retokenized_tail", "sub_agent", "history_rewrite", "unknown"]

#: A break that shares at most this fraction of the best-matching earlier prompt counts as "short".
SHORT_SHARE = 0.5


class Transition(BaseModel):
    """How one call relates to what came before it in its session."""

    model_config = ConfigDict(frozen=True)

    kind: TransitionKind
    chain_id: int
    to_node: str
    #: in-chain: the previous call of the chain; break: the best-matching earlier call.
    from_node: str
    #: first position of ``to_node``'s prompt that departs from the reference (None when exact).
    divergence: int | None = None
    #: replay_drift: sampled ids not reproduced; break: tokens of the best match past the divergence.
    drift_tokens: int = 0
    cause: BreakCause | None = None


@dataclass(slots=True)
class Chain:
    """Calls whose prompts extend one another, in call order."""

    chain_id: int
    calls: list[Call]

    @property
    def node_ids(self) -> list[str]:
        return [call.node_id for call in self.calls]


@dataclass(frozen=True, slots=True)
class ChainGrouping:
    """The chains of a session and one transition per call except the session's first."""

    chains: list[Chain]
    transitions: list[Transition]

    def transition_into(self, node_id: str) -> Transition | None:
        for transition in self.transitions:
            if transition.to_node == node_id:
                return transition
        return None


def in_chain_transition(chain_id: int, prev: Call, call: Call) -> Transition:
    """Classify a step inside a chain (``prev.prompt`` is known to be a prefix of ``call.prompt``)."""
    start = len(prev.prompt)
    if starts_with_at(call.prompt_bytes, prev.completion_bytes, start):
        return Transition(kind="exact", chain_id=chain_id, to_node=call.node_id, from_node=prev.node_id)
    sampled_end = start + len(prev.completion)
    shared = common_prefix_tokens(call.prompt_bytes[start * WIDTH :], prev.completion_bytes)
    return Transition(
        kind="replay_drift",
        chain_id=chain_id,
        to_node=call.node_id,
        from_node=prev.node_id,
        divergence=start + shared,
        drift_tokens=sampled_end - (start + shared),
    )


def _extendable_chain(chains: Sequence[Chain], call: Call) -> Chain | None:
    best: Chain | None = None
    best_len = -1
    for chain in chains:
        tip = chain.calls[-1]
        if (
            len(tip.prompt) < len(call.prompt)
            and len(tip.prompt) > best_len
            and call.prompt_bytes.startswith(tip.prompt_bytes)
        ):
            best, best_len = chain, len(tip.prompt)
    return best


def _best_match(earlier: Sequence[Call], call: Call) -> tuple[int, int]:
    """Position among ``earlier`` of the prompt sharing the longest prefix (latest on ties), and that length."""
    best_pos, best_shared = len(earlier) - 1, -1
    for pos in range(len(earlier) - 1, -1, -1):
        shared = common_prefix_tokens(earlier[pos].prompt_bytes, call.prompt_bytes)
        if shared > best_shared:
            best_pos, best_shared = pos, shared
    return best_pos, best_shared


def group_chains(calls: Sequence[Call]) -> ChainGrouping:
    """Group calls (in call order) into chains by canonical prompt prefixes; never reads sampled ids to group."""
    chains: list[Chain] = []
    chain_of: list[int] = []  # chain id per call position
    predecessor: list[int | None] = []  # position of the previous call in the same chain
    last_position: dict[int, int] = {}  # chain id -> position of its latest call
    transitions: list[Transition | None] = []
    breaks: list[int] = []
    for pos, call in enumerate(calls):
        target = _extendable_chain(chains, call)
        if target is None:
            chain = Chain(chain_id=len(chains), calls=[call])
            chains.append(chain)
            chain_of.append(chain.chain_id)
            predecessor.append(None)
            transitions.append(None)
            if pos > 0:
                breaks.append(pos)
        else:
            prev = target.calls[-1]
            target.calls.append(call)
            chain_of.append(target.chain_id)
            predecessor.append(last_position[target.chain_id])
            transitions.append(in_chain_transition(target.chain_id, prev, call))
        last_position[chain_of[pos]] = pos

    for pos in breaks:
        call = calls[pos]
        best_pos, shared = _best_match(calls[:pos], call)
        best = calls[best_pos]
        transitions[pos] = Transition(
            kind="break",
            chain_id=chain_of[pos],
            to_node=call.node_id,
            from_node=best.node_id,
            divergence=shared,
            drift_tokens=len(best.prompt) - shared,
            cause=_break_cause(calls, pos, best_pos, shared, chain_of, predecessor, last_position),
        )
    return ChainGrouping(chains=chains, transitions=[t for t in transitions if t is not None])


def _break_cause(
    calls: Sequence[Call],
    pos: int,
    best_pos: int,
    shared: int,
    chain_of: Sequence[int],
    predecessor: Sequence[int | None],
    last_position: dict[int, int],
) -> BreakCause:
    call, best = calls[pos], calls[best_pos]
    if shared == len(best.prompt) == len(call.prompt):
        return "resample"
    before = predecessor[best_pos]
    if before is not None and shared >= len(calls[before].prompt):
        return "retokenized_tail"
    if shared <= SHORT_SHARE * len(best.prompt):
        return "sub_agent" if last_position[chain_of[best_pos]] > pos else "history_rewrite"
    return "unknown"
