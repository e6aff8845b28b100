"""The named harness equivalences, each accepted; anything else is a history change."""

from __future__ import annotations

import pytest

from openenv_harness.recorder.history_match import digest, used_equivalences

CALL = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
REPLY = {"role": "assistant", "content": None, "reasoning": "think", "tool_calls": [CALL]}


@pytest.mark.parametrize(("replayed", "name"), [
    ({**REPLY, "tool_calls": [{**CALL, "function": {"name": "bash", "arguments": '{"command":"ls"}'}}]},
     "tool_arguments_reserialized"),
    ({"role": "assistant", "content": None, "reasoning_content": "think", "tool_calls": [CALL]},
     "reasoning_field_renamed"),
    ({**REPLY, "content": [{"type": "text", "text": ""}]}, "content_reflattened"),
    ({**REPLY, "content": ""}, "content_reflattened"),
])
def test_each_equivalence_is_accepted_and_named(replayed: dict, name: str) -> None:
    assert digest(replayed) == digest(REPLY)
    assert used_equivalences(replayed, REPLY) == [name]


@pytest.mark.parametrize("replayed", [
    {**REPLY, "tool_calls": [{**CALL, "function": {"name": "bash", "arguments": '{"command": "pwd"}'}}]},
    {**REPLY, "reasoning": None},  # reasoning dropped
    {**REPLY, "content": "I will list."},
    {**REPLY, "tool_calls": [{**CALL, "function": {"name": "read", "arguments": '{"command": "ls"}'}}]},
    {**REPLY, "tool_calls": [CALL, CALL]},
])
def test_anything_else_is_a_change(replayed: dict) -> None:
    assert digest(replayed) != digest(REPLY)


def test_identical_uses_no_equivalence() -> None:
    assert used_equivalences(dict(REPLY), REPLY) == []
