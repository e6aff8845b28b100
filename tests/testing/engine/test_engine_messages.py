"""vLLM 0.32's message preprocessing, rule by rule (each rule measured on the real engine; the
conformance test in tests/real_engine holds the whole pipeline to it by prompt ids)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from openenv_harness.testing.engine.messages import MessageError, prepare_messages, prepare_tools
from openenv_harness.testing.engine.template import ChatTemplate, reference_template

CALL = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}


def _assistant(**fields: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [CALL], **fields}


@pytest.mark.parametrize("route, field, kept", [
    ("chat", "reasoning", True), ("tokenize", "reasoning", True),
    ("chat", "reasoning_content", True), ("tokenize", "reasoning_content", False),  # only the chat route renames
    ("chat", "thinking", False), ("tokenize", "thinking", False),
])
def test_replayed_reasoning_depends_on_the_field_name_and_the_route(route: str, field: str, kept: bool) -> None:
    [message] = prepare_messages([_assistant(**{field: "Plan."})], route=route)  # type: ignore[arg-type]
    if kept:
        assert message["reasoning"] == message["reasoning_content"] == "Plan."  # templates read either
    else:
        assert "reasoning" not in message and "reasoning_content" not in message
    assert "thinking" not in message


def test_reasoning_wins_over_reasoning_content_and_rename_can_be_turned_off() -> None:
    [both] = prepare_messages([_assistant(reasoning="A", reasoning_content="B")])
    assert both["reasoning"] == both["reasoning_content"] == "A"
    [dropped] = prepare_messages([_assistant(reasoning_content="B")], reasoning_content="drop")
    assert "reasoning_content" not in dropped


def test_messages_are_rebuilt_from_known_fields_only() -> None:
    user = {"role": "user", "content": "hi", "name": "bob", "id": "msg_1", "cache_control": {"type": "x"}}
    tool = {"role": "tool", "tool_call_id": "c1", "content": "out", "is_error": False}
    assert prepare_messages([user, tool]) == [{"role": "user", "content": "hi", "name": "bob"},
                                              {"role": "tool", "content": "out", "tool_call_id": "c1"}]


def test_content_parts_are_joined_for_string_templates_and_kept_as_parts_for_openai_ones() -> None:
    parts = [{"type": "text", "text": "one"}, {"type": "thinking", "thinking": "two"}, "three"]
    messages = [{"role": "user", "content": parts}, {"role": "assistant", "content": None},
                {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "a"}, {"type": "text",
                                                                                               "text": "b"}]}]
    as_string = prepare_messages(messages, content_format="string")
    assert [m["content"] for m in as_string] == ["one\ntwo\nthree", "", "a\nb"]
    as_parts = prepare_messages(messages + [{"role": "user", "content": "plain"}], content_format="openai")
    assert as_parts[0]["content"] == [{"type": "text", "text": t} for t in ("one", "two", "three")]
    assert as_parts[1]["content"] == [] and as_parts[2]["content"] == "a\nb"  # tool results always a string
    assert as_parts[3]["content"] == [{"type": "text", "text": "plain"}]


def test_media_and_unknown_parts_are_a_400() -> None:
    for part, match in (({"type": "image_url", "image_url": {"url": "x"}}, "text-only"),
                        ({"type": "input_text", "text": "x"}, "unknown content part type")):
        with pytest.raises(MessageError, match=match):
            prepare_messages([{"role": "user", "content": [part]}])


def test_tool_call_arguments_are_parsed_and_bad_ones_become_empty_objects() -> None:
    calls = [{**CALL, "function": {"name": "bash", "arguments": a}} for a in ('{"n": 1.0}', "{oops", "[1]", "")]
    original = [_assistant(tool_calls=calls)]
    snapshot = copy.deepcopy(original)
    [message] = prepare_messages(original)
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == [{"n": 1.0}, {}, {}, {}]
    assert original == snapshot, "the request is never mutated"
    [verbatim] = prepare_messages(original, tool_arguments="verbatim")
    assert verbatim["tool_calls"][0]["function"]["arguments"] == '{"n": 1.0}'
    with pytest.raises(MessageError, match="arguments must be a JSON string"):
        prepare_messages([_assistant(tool_calls=[{**CALL, "function": {"name": "bash", "arguments": {"n": 1}}}])])
    with pytest.raises(MessageError, match="type 'function'"):
        prepare_messages([_assistant(tool_calls=[{**CALL, "type": "custom"}])])


def test_empty_tool_calls_are_dropped() -> None:
    [message] = prepare_messages([{"role": "assistant", "content": "hi", "tool_calls": []}])
    assert message == {"role": "assistant", "content": "hi"}


def test_developer_becomes_system_where_the_template_does_not_know_it() -> None:
    messages = [{"role": "system", "content": "S1"}, {"role": "user", "content": "u"},
                {"role": "developer", "content": [{"type": "text", "text": "D1"}], "tools": []}]
    kept = prepare_messages(messages, developer_role=True)
    assert [m["role"] for m in kept] == ["system", "user", "developer"]
    merged = prepare_messages(messages, developer_role=False)
    assert merged == [{"role": "system", "content": "S1\n\nD1"}, {"role": "user", "content": "u"}]
    assert reference_template().knows_developer
    assert not ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}").knows_developer


def test_claude_codes_billing_header_is_stripped_from_system_text() -> None:
    system = {"role": "system", "content": [{"type": "text", "text": "x-anthropic-billing-header: cch=1\nBe kind."},
                                            {"type": "text", "text": "x-anthropic-billing-header: only"}]}
    assert prepare_messages([system])[0]["content"] == "Be kind."


def test_tools_are_reserialized_like_vllms_pydantic_models() -> None:
    tools = [{"type": "function", "x": 1, "function": {"parameters": {"type": "object"}, "name": "zed", "strict": True,
                                                       "extra": 2}},
             {"function": {"name": "nop"}}]
    assert prepare_tools(tools) == [
        {"type": "function", "function": {"name": "zed", "description": None, "parameters": {"type": "object"},
                                          "strict": True}},
        {"type": "function", "function": {"name": "nop", "description": None, "parameters": None}}]
    assert list(prepare_tools(tools)[0]["function"]) == ["name", "description", "parameters", "strict"]
    assert prepare_tools(None) is None
    with pytest.raises(MessageError, match="string 'name'"):
        prepare_tools([{"type": "function", "function": {}}])
