"""The reference chat template: ChatML-like, tool-aware, prefix-preserving at text and token level."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from jinja2 import TemplateError

from openenv_harness.testing.engine.policy import ToolCallSpec, Turn, turn_message
from openenv_harness.testing.engine.replay import agent_echo
from openenv_harness.testing.engine.messages import prepare_messages
from openenv_harness.testing.engine.template import ChatTemplate, reference_template
from openenv_harness.testing.engine.tokenizer import reference_tokenizer

SYSTEM = {"role": "system", "content": "You are a coding agent. Use the tools."}
USER = {"role": "user", "content": [{"type": "text", "text": "Run ls and tell me what you see."}]}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
                                      "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}},
]


def _assistant(content: Any = None, reasoning: str | None = None, calls: list[tuple[str, Any]] = ()) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                                 for i, (n, a) in enumerate(calls)]
    return message


CONVERSATIONS = [
    [SYSTEM, USER],
    [USER],
    [SYSTEM, USER, _assistant("", "Think first.", [("bash", '{"command":"ls"}')]),
     {"role": "tool", "tool_call_id": "call_0", "content": "a.txt\n"}],
    [SYSTEM, USER, _assistant("Two at once.", None, [("bash", '{"command": "ls"}'), ("read", {"path": "a.txt"})]),
     {"role": "tool", "tool_call_id": "call_0", "content": "a.txt"},
     {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "hello"}]}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_history_is_a_prefix_of_the_next_prompt(messages: list[dict]) -> None:
    template = reference_template()
    tok = reference_tokenizer()
    before = template.render(messages, TOOLS)
    extended = messages + [_assistant(None, None, [("bash", '{"command":"pwd"}')]),
                           {"role": "tool", "tool_call_id": "call_0", "content": "/home\n"}]
    after = template.render(extended, TOOLS, add_generation_prompt=True)
    assert after.startswith(before)
    assert tok.encode(after)[: len(tok.encode(before))] == tok.encode(before)


def test_generation_prompt_and_system_block_with_tools() -> None:
    text = reference_template().render([SYSTEM, USER], TOOLS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a coding agent. Use the tools.\n\n# Tools")
    assert '{"name": "bash", "description": "Run a shell command."' in text
    assert text.endswith("<|im_start|>user\nRun ls and tell me what you see.<|im_end|>\n<|im_start|>assistant\n")


def test_without_tools_a_system_message_is_its_own_turn() -> None:
    text = reference_template().render([SYSTEM, {"role": "user", "content": "hi"}])
    assert text == ("<|im_start|>system\nYou are a coding agent. Use the tools.<|im_end|>\n"
                    "<|im_start|>user\nhi<|im_end|>\n")


def test_text_parts_are_joined_and_other_parts_ignored() -> None:
    content = [{"type": "text", "text": "one"}, {"type": "image_url", "image_url": {}},
               {"type": "text", "text": "two"}]
    rendered = reference_template().render([{"role": "user", "content": content}])
    assert rendered == "<|im_start|>user\none\ntwo<|im_end|>\n"


def test_assistant_turn_layout() -> None:
    template = reference_template()
    with_content = template.render_sampled_turn(_assistant("Checking.", "Hmm.", [("bash", '{"command":"ls"}')]))
    assert with_content == ('<think>\nHmm.\n</think>\n\nChecking.\n<tool_call>\n{"name": "bash", "arguments": '
                            '{"command":"ls"}}\n</tool_call><|im_end|>')
    no_content = template.render_sampled_turn(_assistant(None, None, [("a", "{}"), ("b", {"x": "é"})]))
    assert no_content == ('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n'
                          '{"name": "b", "arguments": {"x": "é"}}\n</tool_call><|im_end|>')
    assert template.render_sampled_turn(_assistant("Done.")) == "Done.<|im_end|>"


def test_string_arguments_render_verbatim_and_objects_with_tojson() -> None:
    template = reference_template()
    raw = '{"command":  "ls",\n "timeout" :5}'
    assert raw in template.render_sampled_turn(_assistant(None, None, [("bash", raw)]))
    parsed = prepare_messages([_assistant(None, None, [("bash", raw)])], tool_arguments="parsed")
    assert '{"command": "ls", "timeout": 5}' in template.render_sampled_turn(parsed[0])


def test_reasoning_field_names_are_interchangeable() -> None:
    template = reference_template()
    a = template.render_sampled_turn({"content": "x", "reasoning": "why"})
    b = template.render_sampled_turn({"content": "x", "reasoning_content": "why"})
    c = template.render_sampled_turn({"content": "x", "reasoning": None, "reasoning_content": "why"})
    assert a == b == c == "<think>\nwhy\n</think>\n\nx<|im_end|>"


def test_policy_text_survives_an_agent_echo_when_arguments_are_compact() -> None:
    template = reference_template()
    turn = Turn(reasoning="Plan.", tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls", "timeout": 5})])
    sampled = template.render_sampled_turn(turn_message(turn))
    engine_reply = {"role": "assistant", "content": None, "reasoning": "Plan.", "tool_calls": [
        {"id": "t", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls", "timeout": 5}'}}]}
    for style in ("opencode", "pi"):
        assert template.render_sampled_turn(agent_echo(engine_reply, style)) == sampled


def test_unknown_role_is_a_template_error() -> None:
    with pytest.raises(TemplateError, match="Unsupported message role: robot"):
        reference_template().render([{"role": "robot", "content": "beep"}])


def test_prepare_messages_never_mutates_and_coerces_bad_json_like_vllm() -> None:
    messages = [USER, _assistant(None, None, [("bash", '{"command":"ls"}')]), _assistant("x")]
    messages[2]["tool_calls"] = []
    snapshot = copy.deepcopy(messages)
    prepared = prepare_messages(messages, tool_arguments="parsed")
    assert messages == snapshot
    assert prepared[1]["tool_calls"][0]["function"]["arguments"] == {"command": "ls"}
    assert "tool_calls" not in prepared[2]
    # vLLM 0.32 keeps the conversation going: an unparsable or non-object argument string becomes {}
    for bad in ("{oops", "[1, 2]", ""):
        [fixed] = prepare_messages([_assistant(None, None, [("bash", bad)])], tool_arguments="parsed")
        assert fixed["tool_calls"][0]["function"]["arguments"] == {}


def test_fingerprint_is_the_sha256_of_the_source() -> None:
    import hashlib

    template = reference_template()
    assert template.sha256 == hashlib.sha256(template.source.encode()).hexdigest()
    assert ChatTemplate(template.source + " ").sha256 != template.sha256
