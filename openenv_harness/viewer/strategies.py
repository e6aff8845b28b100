"""Per-strategy assembly numbers for one session: what a trainer would get out of it.

Why lazily imported: the recorder serves agents and must not load the trainer-side assembler (nor
pay for it) unless someone opens a session's assembly panel. The import happens on first use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class StrategyStatsError(ValueError):
    """The records could not be assembled; the message names the offending record."""


def strategy_stats(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-strategy ``SessionStats``, and the assembler's chains and transitions, as JSON.

    ``strategies`` maps each strategy to its trainable-token ratio (mask-1 ids over response ids,
    and over all ids), the exact / drift / break counts and what it did at each drift.
    ``transitions`` says, per call, how the assembler linked it -- with a *cause* for each break
    (resample, sub-agent, history rewrite...), which the recorder's own classification lacks.
    """
    from openenv_harness.assembly import (  # lazy: trainer-side code
        AssemblyError,
        compare_strategies,
        group_chains,
        select_calls,
    )

    try:
        by_strategy = compare_strategies(entries)
        grouping = group_chains(select_calls(entries).calls)
    except AssemblyError as exc:
        raise StrategyStatsError(str(exc)) from None
    return {
        "strategies": {name: stats.model_dump(mode="json") for name, stats in by_strategy.items()},
        "chains": [chain.node_ids for chain in grouping.chains],
        "transitions": [t.model_dump(mode="json") for t in grouping.transitions],
    }
