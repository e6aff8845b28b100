"""The rollout summary's chain label says what the fidelity counts say."""

from __future__ import annotations

from openenv_harness.rollout.report import RolloutReport, summarize_records


def _record(fidelity: str | None, kind: str = "agent") -> dict:
    return {"prompt_token_ids": [1], "completion_token_ids": [2],
            "metadata": {"status": "ok", "call_kind": kind, "fidelity": {"class": fidelity} if fidelity else None}}


def test_chain_labels_follow_the_transition_counts() -> None:
    def label(*classes: str) -> str:
        return summarize_records(RolloutReport("s", "pi", "t"), [_record(c) for c in classes]).chain_status

    assert summarize_records(RolloutReport("s", "pi", "t"), []).chain_status == "no calls"
    assert label("root") == "single call"  # one call has no transition: it is not "exact"
    assert label("root", "exact", "exact") == "exact (2 transitions)"
    assert label("root", "exact", "replay_drift", "break") == "1 exact, 1 drift, 1 break"
