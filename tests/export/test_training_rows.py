"""The rows of a training trace as TRL builds them, checked against TRL 1.16's own reconciler."""

from __future__ import annotations

import os
from typing import Any

import pytest
from export_records import Records

from openenv_harness.export import ExportFilters, export_session, training_rows


def _turn(prompt: list[int], completion: list[int]) -> dict[str, Any]:
    return {"prompt_token_ids": prompt, "completion_token_ids": completion}


def test_a_turn_continues_the_row_only_when_the_held_tokens_prefix_its_prompt() -> None:
    turns = [
        _turn([1, 2], [3]),
        _turn([1, 2, 3, 4], [5]),        # held [1, 2, 3] is a prefix: same row
        _turn([1, 2, 3, 4, 5], [6]),     # the prompt equals what is held: same row (nothing added as context)
        _turn([1, 2, 9], [7]),           # drift from what is held: a new row
        _turn([1, 2, 9, 7, 8], [0]),
        _turn([1], [2]),                 # shorter than what is held: a new row
    ]
    assert training_rows(turns) == [[0, 1, 2], [3, 4], [5]]
    assert training_rows([]) == []


@pytest.fixture(scope="module")
def trl() -> Any:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    pytest.importorskip("trl")
    from trl.experimental.async_grpo import async_rollout_worker, openenv_harness

    return async_rollout_worker, openenv_harness


def _sessions() -> list[Records]:
    """A chain that straddles a sync, a new conversation at the new version, and a chain at the old one."""
    s = Records()
    s.call((0, 1))
    s.call((1, 1))
    s.call((1, 1), fresh=True)
    s.call((1, 1))
    s.call((0, 0), fresh=True, completion=(50, 51, 52, 5))
    return [s]


@pytest.mark.compat
@pytest.mark.parametrize("filters", [ExportFilters(), ExportFilters(drop_straddled=True),
                                     ExportFilters(max_staleness=0), ExportFilters(max_staleness=0, current_version=0)])
def test_trl_reads_every_filtered_training_export_into_the_rows_we_counted(trl: Any, filters: ExportFilters) -> None:
    worker, harness = trl
    [session] = _sessions()
    done = export_session(session.records, "training", filters=filters)
    turns = harness._turns_from_training_trace(done.rows)
    rows, tally = worker._chain_to_sequences(turns, "rollout", 0)  # loop-owning mode's fork threshold
    ours = training_rows([t.model_dump() for t in done.rows.turns])
    assert len(rows) == len(ours) == done.report.kept
    for row, group in zip(rows, ours, strict=True):
        last = done.rows.turns[group[-1]]
        assert row.input_ids == [*last.prompt_token_ids, *last.completion_token_ids]
        assert sum(row.completion_mask) == sum(len(done.rows.turns[i].completion_token_ids) for i in group)
    assert tally["fork"] == len(ours) - 1
    assert {t.metadata["training_row"]["index"] for t in done.rows.turns} == set(range(len(ours)))


@pytest.mark.compat
def test_the_kept_rows_are_the_right_ones(trl: Any) -> None:
    [session] = _sessions()
    kept = {
        "straddled": export_session(session.records, "training", filters=ExportFilters(drop_straddled=True)),
        "stale": export_session(session.records, "training", filters=ExportFilters(max_staleness=0)),
    }
    assert [t.node_id for t in kept["straddled"].rows.turns] == ["s/2", "s/3", "s/4"]
    assert [t.node_id for t in kept["stale"].rows.turns] == ["s/2", "s/3"]
    assert kept["stale"].report.dropped == {"stale": 2} and kept["straddled"].report.dropped == {"straddled": 1}
