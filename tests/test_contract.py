"""The record contract: OpenEnv's shapes, OpenEnv's own validation, and a committed, current schema."""

from __future__ import annotations

import json

import pytest

from openenv_harness import contract


def _entry(node: str, prompt: list[int], completion: list[int], logps: list[float], **md) -> dict:
    return {
        "request": {"messages": [{"role": "user", "content": "x"}]},
        "response": {"choices": [{"message": {"role": "assistant", "content": "y"}, "finish_reason": "stop"}]},
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "per_token_logps": logps,
        "loss_mask": contract.loss_mask_for(len(prompt), len(completion), True),
        "metadata": {"node_id": node, "session_id": "s", "seq": 1, "call_index": 0, "call_kind": "agent",
                     "status": "ok", **md},
    }


def test_committed_schema_is_current() -> None:
    on_disk = contract.SCHEMA_PATH.read_text()
    assert on_disk == contract.render_json_schema(), "run: python -m openenv_harness.contract"
    schema = json.loads(on_disk)
    assert set(schema["properties"]) == set(contract.TRACE_ENTRY_KEYS) - {"reward"}


def test_trace_entry_keys_match_openenv() -> None:
    from openenv.core.harness import TraceEntry

    assert set(TraceEntry.__annotations__) == set(contract.TRACE_ENTRY_KEYS)


def test_training_trace_dict_validates_with_openenv_and_selects_agent_ok_calls() -> None:
    from openenv.core.harness import TrainingTrace

    entries = [
        _entry("s/0", [1, 2, 3], [4, 5], [-0.1, -0.2]),
        _entry("s/1", [1, 2], [9], [-0.3], call_kind="aux"),
        _entry("s/2", [1, 2, 3, 4, 5, 6], [7], [-0.5], status="invalid"),
        {**_entry("s/3", [], [], []), "metadata": {"node_id": "s/3", "status": "failed", "call_kind": "agent"}},
        _entry("s/4", [1, 2, 3, 4, 5, 6], [7, 8], [-0.5, -1.0]),
    ]
    data = contract.training_trace_dict(entries)
    trace = TrainingTrace.model_validate(data)
    assert [t.node_id for t in trace.turns] == ["s/0", "s/4"]
    assert trace.turns[1].loss_mask == [0] * 6 + [1, 1]
    assert contract.to_training_trace(entries).model_dump() == trace.model_dump()


def test_a_trainer_is_never_offered_post_mask_logprobs_as_the_policys() -> None:
    """A call under a decoding constraint: its ids are mask 0 in the training trace by default
    (``non_policy="keep"`` keeps the record's mask); the record itself is unchanged."""
    from openenv.core.harness import TrainingTrace

    entries = [_entry("s/0", [1, 2, 3], [4, 5], [-0.1, -0.2]),
               _entry("s/1", [1, 2, 3, 4, 5, 6], [7, 8], [-1e-9, -12.0], logprobs_are_policy=False)]
    masked = TrainingTrace.model_validate(contract.training_trace_dict(entries))
    assert [t.loss_mask for t in masked.turns] == [[0, 0, 0, 1, 1], [0] * 8]
    assert contract.to_training_trace(entries).model_dump() == masked.model_dump()
    kept = contract.to_training_trace(entries, non_policy="keep")
    assert kept.turns[1].loss_mask == [0] * 6 + [1, 1]
    assert entries[1]["loss_mask"] == [0] * 6 + [1, 1], "the record keeps what was sampled"
    with pytest.raises(ValueError, match="non_policy"):
        contract.to_training_trace(entries, non_policy="trust")


def test_openenv_rejects_what_we_must_never_emit() -> None:
    """OpenEnv's validator is the judge: positive logprobs or misaligned arrays are refused."""
    from openenv.core.harness import TrainingTrace

    bad = _entry("s/0", [1, 2], [3, 4], [-0.1])
    with pytest.raises(ValueError):
        TrainingTrace.from_entries([bad])
    # and our selection never forwards it
    assert contract.training_trace_dict([bad])["turns"] == []


def test_record_model_accepts_a_recorded_entry() -> None:
    e = _entry("s/0", [1, 2, 3], [4, 5], [-0.1, -0.2], seq=7)
    rec = contract.TraceRecord.model_validate(e)
    assert rec.metadata.seq == 7 and rec.metadata.call_kind == "agent"


def test_records_jsonl_groups_by_session_and_names_a_bad_line() -> None:
    from openenv_harness.contract import records_by_session

    lines = ['{"metadata": {"session_id": "a", "call_index": 0}}', "",
             '{"metadata": {"session_id": "b", "call_index": 0}}', '{"metadata": {"session_id": "a", "call_index": 1}}']
    grouped = records_by_session(lines)
    assert {k: [r["metadata"]["call_index"] for r in v] for k, v in grouped.items()} == {"a": [0, 1], "b": [0]}
    with pytest.raises(ValueError, match=r"^run\.jsonl:2: not a record with metadata\.session_id"):
        records_by_session([lines[0], '{"metadata": {}}'], source="run.jsonl")
    with pytest.raises(ValueError, match=r"records:1: not a record"):
        records_by_session(["not json"])
