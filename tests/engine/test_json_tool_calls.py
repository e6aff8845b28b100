"""The plain-text JSON tool-call reading the engine's parser plugin applies."""

from __future__ import annotations

import json

from openenv_harness.engine.json_tool_calls import parse_json_tool_calls

TOOLS = ["bash", "read", "edit", "write"]


def test_a_fenced_json_call_becomes_a_tool_call() -> None:
    out = 'I will look at the file.\n```json\n{"name": "bash", "arguments": {"command": "cat add.py"}}\n```'
    parsed = parse_json_tool_calls(out, TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("bash", {"command": "cat add.py"})]
    assert parsed.content == "I will look at the file."


def test_a_bare_json_answer_and_string_arguments() -> None:
    out = '{"name": "read", "arguments": "{\\"path\\": \\"add.py\\"}"}'
    parsed = parse_json_tool_calls(out, TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("read", {"path": "add.py"})]
    assert parsed.content is None


def test_several_calls_in_one_block_and_in_several_blocks() -> None:
    block = json.dumps([{"name": "bash", "arguments": {"command": "ls"}}, {"name": "read", "parameters": {"path": "a"}}])
    out = f"```\n{block}\n```\nthen\n```json\n" + json.dumps({"name": "bash", "arguments": {"command": "pwd"}}) + "\n```"
    names = [c.name for c in parse_json_tool_calls(out, TOOLS).calls]
    assert names == ["bash", "read", "bash"]


def test_json_that_is_not_a_call_to_a_declared_tool_stays_text() -> None:
    for out in ('```json\n{"name": "deploy", "arguments": {}}\n```',  # not a declared tool
                '```json\n{"a": 1}\n```',  # no name
                '```python\n{"name": "bash", "arguments": {"command": "ls"}}\n```',  # a code block, not JSON
                '```json\n{"name": "bash", "arguments": {"command": \n```',  # broken JSON
                '{"name": "bash", "arguments": {"env": {"A": "1"',  # three braces short
                '{"name": "bash", "arguments": [1]}',  # arguments not an object
                "The sum is 3."):
        parsed = parse_json_tool_calls(out, TOOLS)
        assert parsed.calls == [] and parsed.content == out, out


def test_without_declared_tools_any_name_is_read() -> None:
    assert [c.name for c in parse_json_tool_calls('{"name": "x", "arguments": {}}', None).calls] == ["x"]


def test_an_end_of_turn_marker_after_a_bare_call_is_ignored() -> None:
    out = '{"name": "bash", "arguments": {"command": "ls"}}<|im_end|>'
    assert parse_json_tool_calls(out, TOOLS).calls == []  # without the marker list it is not JSON
    parsed = parse_json_tool_calls(out, TOOLS, special_tokens=["<|im_end|>", "<|endoftext|>"])
    assert [c.name for c in parsed.calls] == ["bash"] and parsed.content is None


def test_a_call_one_or_two_braces_short_or_an_unclosed_fence_is_read() -> None:
    for out in ('{"name": "bash", "arguments": {"command": "ls"}',
                '{"name": "bash", "arguments": {"command": "ls"',
                '```json\n{"name": "bash", "arguments": {"command": "ls"}}',
                '```json\n{"name": "bash", "arguments": {"command": "ls"}<|im_end|>'):
        parsed = parse_json_tool_calls(out, TOOLS, special_tokens=["<|im_end|>"])
        assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("bash", {"command": "ls"})], out
