"""The rows a trainer builds from a training trace's turns, so a filter can drop whole rows of it.

A ``TrainingTrace`` is per call (OpenEnv's ``TrainingTurn``); rows are made by the consumer. TRL
1.16's harness path (``_turns_from_training_trace`` then ``_chain_to_sequences`` at fork threshold 0,
what loop-owning mode uses) reads the turns in order and lets a turn continue the current row only
when the tokens held so far -- the previous turn's prompt plus its sampled ids -- are a prefix of
its prompt; any other turn starts a new row. ``training_rows`` groups turns by that same rule
(written here from its description; TRL is not imported), so dropping one group's turns drops one
of TRL's rows. Turns left after a drop are regrouped by the same rule: a turn that followed a
dropped row may then continue an earlier one, every trained id still on the context the engine saw.
"""

from __future__ import annotations

from typing import Any

from openenv_harness.contract import CallVersions, call_versions


def training_rows(turns: list[dict[str, Any]]) -> list[list[int]]:
    """Indices of ``turns`` (training entries, in trace order) per row, in order."""
    rows: list[list[int]] = []
    held: list[int] | None = None
    for index, turn in enumerate(turns):
        prompt = turn["prompt_token_ids"]
        if held is not None and len(held) <= len(prompt) and prompt[: len(held)] == held:
            rows[-1].append(index)
        else:
            rows.append([index])
        held = [*prompt, *turn["completion_token_ids"]]
    return rows


def row_summary(versions: list[CallVersions]) -> dict[str, Any]:
    """A row's versions: the oldest start, the newest end, and whether any call straddled a sync."""
    return {"policy_version_start": min(v.policy_version_start for v in versions),
            "policy_version_end": max(v.policy_version_end for v in versions),
            "straddled_sync": any(v.straddled_sync for v in versions)}


def annotate_rows(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``turns`` with ``metadata.training_row`` on each: the index of the row it lands in and that row's
    versions (``row_summary``). The call's own versions stay where the record put them
    (``metadata.policy_version_start`` / ``policy_version_end`` / ``straddled_sync`` /
    ``weight_versions``)."""
    out = list(turns)
    for number, row in enumerate(training_rows(turns)):
        summary = {"index": number, **row_summary([call_versions(turns[i]) for i in row])}
        for i in row:
            out[i] = {**turns[i], "metadata": {**turns[i].get("metadata", {}), "training_row": summary}}
    return out
