"""Incremental prompt mode under TRL 1.16's own loop and reconciler, with real Pi and OpenCode.

The same drift-inducing scripts that make full-history rollouts fork in ``test_trl_compat.py``
(re-serialized tool JSON: spaced arguments sampled, replayed compact; noncanonical segmentation)
give one exact chain here: TRL classifies every in-chain transition CLEAN at fork threshold 0 and
trains every sampled token once, in one row.
"""

from __future__ import annotations

import pytest

from test_trl_compat import (  # noqa: F401  (fixtures)
    HARNESSES, SCRIPTS, Rollouts, accelerate_state, assert_rows_cover_turns_once, rollouts, tokenizer,
)
from trl.experimental.async_grpo.async_rollout_worker import _chain_to_sequences
from trl.experimental.async_grpo.openenv_harness import _turns_from_training_trace

pytestmark = [pytest.mark.compat, pytest.mark.cli]


@pytest.mark.parametrize("label", ["noncanonical", "rewritten"])
@pytest.mark.parametrize("harness", HARNESSES)
def test_incremental_rollouts_are_one_clean_row_where_full_history_forks(harness: str, label: str,
                                                                         rollouts: Rollouts) -> None:
    full = rollouts.get(harness, label)
    assert "replay_drift" in full.fidelity and full.metrics["tally"]["fork"] >= 1
    run = rollouts.get(harness, f"incremental-{label}", script=SCRIPTS[label], prompt_mode="incremental",
                       prompt_mode_strict=True)
    assert run.reward == 1.0
    assert run.fidelity == ["root", "exact", "exact", "exact"]
    modes = [t.metadata["prompt_mode"] for t in run.trace.turns]
    assert [m["continued"] for m in modes] == [False, True, True, True]
    turns = _turns_from_training_trace(run.trace)
    assert all(t.output_mask == [1] * len(t.output_ids) for t in turns)
    rows, tally = _chain_to_sequences(turns, "replayed", 0)
    assert tally["clean"] == 3.0 and tally["fork"] == 0.0 and tally["realign"] == 0.0
    assert len(rows) == 1
    assert_rows_cover_turns_once(rows, [turns], run.agent_requests)
    assert run.metrics["tally"] == tally  # TRL's loop trained the same single row
    assert sum(rows[0].completion_mask) == sum(len(r["sampled"]["token_ids"]) for r in run.agent_requests)


@pytest.mark.parametrize("label", ["noncanonical", "rewritten"])
def test_realign_keeps_at_least_what_trls_own_realign_keeps(label: str, rollouts: Rollouts) -> None:
    """Full history, same trace: our realign masks only from each divergence point on."""
    from openenv_harness.assembly import assemble_session

    run = rollouts.get("pi", label)
    turns = _turns_from_training_trace(run.trace)
    trl_rows, trl_tally = _chain_to_sequences(turns, "threshold", 1024)
    assert trl_tally["realign"] >= 1
    trl_kept = sum(sum(r.completion_mask) for r in trl_rows)
    ours = assemble_session(rollouts.admin.records(run.session["session_id"]), strategy="realign")
    assert ours.stats.resolutions.realigned == trl_tally["realign"]
    assert ours.stats.trainable_tokens >= trl_kept
    sampled = sum(len(t.output_ids) for t in turns)
    assert ours.stats.trainable_tokens < sampled  # drift costs something in full history ...
    assert ours.stats.resolutions.lost_tokens == sampled - ours.stats.trainable_tokens
