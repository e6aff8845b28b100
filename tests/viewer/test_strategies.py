"""Assembly numbers for the viewer: the assembler's own, loaded only when asked for."""

from __future__ import annotations

import subprocess
import sys

import pytest

from openenv_harness.assembly import compare_strategies
from openenv_harness.contract import loss_mask_for
from openenv_harness.viewer.strategies import StrategyStatsError, strategy_stats


def entry(index: int, prompt: list[int], completion: list[int]) -> dict:
    return {
        "request": {}, "response": {"choices": [{"finish_reason": "stop"}]},
        "prompt_token_ids": prompt, "completion_token_ids": completion,
        "per_token_logps": [-0.25] * len(completion), "loss_mask": loss_mask_for(len(prompt), len(completion), True),
        "metadata": {"node_id": f"s/{index}", "session_id": "s", "call_index": index, "seq": index + 1,
                     "call_kind": "agent", "status": "ok", "trainable": True},
    }


def test_stats_per_strategy_with_transitions() -> None:
    entries = [entry(0, [1, 2], [3, 9]), entry(1, [1, 2, 3, 9, 5], [6, 9]), entry(2, [1, 2, 3, 9, 5, 6, 8, 4], [7, 9])]
    stats = strategy_stats(entries)
    assert stats["strategies"] == {k: v.model_dump(mode="json") for k, v in compare_strategies(entries).items()}
    assert set(stats["strategies"]) == {"split", "realign", "approximate"}
    assert [(t["to_node"], t["kind"]) for t in stats["transitions"]] == [("s/1", "exact"), ("s/2", "replay_drift")]
    assert stats["chains"] == [["s/0", "s/1", "s/2"]]


def test_malformed_records_raise_a_named_error() -> None:
    bad = entry(0, [1, 2], [3])
    bad["metadata"]["call_index"] = "zero"
    with pytest.raises(StrategyStatsError, match="call_index"):
        strategy_stats([bad])


def test_the_recorder_does_not_load_the_assembler() -> None:
    """Serving the viewer must not make the recorder import trainer-side code up front."""
    code = ("import sys, openenv_harness.recorder.app; "
            "loaded = [m for m in sys.modules if m.startswith('openenv_harness.assembly')]; "
            "assert 'openenv_harness.viewer' in sys.modules; print(loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
