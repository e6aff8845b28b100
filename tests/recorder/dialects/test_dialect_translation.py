"""Translation and classification of what Codex and Claude Code really sent (captured), and the small
pieces behind replay fidelity: the sampled-argument search and the bounded replay memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openenv_harness.harnesses import get_preset
from openenv_harness.recorder.classify import classify_call
from openenv_harness.recorder.dialects import anthropic_request, responses_request
from openenv_harness.recorder.dialects.memory import ReplayMemory
from openenv_harness.recorder.dialects.sampled import raw_arguments, sampled_text
from openenv_harness.recorder.session.spec import AuxRule

CAPTURES = Path(__file__).resolve().parents[2] / "data" / "harness_capture"


def captured(harness: str, scenario: str, suffix: str) -> list[dict]:
    files = sorted((CAPTURES / harness / scenario / "requests").glob(f"*{suffix}.json"))
    assert files, f"no captures for {harness}/{scenario}"
    return [json.loads(f.read_text())["body"] for f in files]


def preset_rules(harness: str) -> list[AuxRule]:
    return [AuxRule(**rule.as_flat()) for rule in get_preset(harness).aux_rules] + [AuxRule(name="no-tools",
                                                                                           no_tools=True)]


@pytest.mark.parametrize("scenario", ["basic", "reasoning", "title"])
def test_claude_code_requests_translate(scenario: str) -> None:
    for body in captured("claude-code", scenario, "v1_messages"):
        chat, call = anthropic_request.to_chat(body, ReplayMemory())
        assert call.model == body["model"] and chat["stream"] is True
        system = chat["messages"][0]
        assert system["role"] == "system" and not system["content"].startswith("x-anthropic-billing-header")
        assert "x-anthropic-billing-header" not in json.dumps(chat["messages"])
        assert chat["max_tokens"] == body["max_tokens"] and chat["reasoning_effort"] == "high"
        assert {t["function"]["name"] for t in chat.get("tools", [])} == {t["name"] for t in body["tools"]}
        roles = [m["role"] for m in chat["messages"]]
        if body["tools"]:  # a turn (not the title call): Claude Code's environment message stays in place
            assert roles[:3] == ["system", "user", "system"]
        if "tool" in roles:  # a tool result is a tool message right after the call it answers
            i = roles.index("tool")
            assert chat["messages"][i - 1]["tool_calls"][0]["id"] == chat["messages"][i]["tool_call_id"]


def test_claude_code_thinking_and_env_message_round_trip() -> None:
    first, second = captured("claude-code", "reasoning", "v1_messages")
    chat, _ = anthropic_request.to_chat(second, ReplayMemory())
    assistant = [m for m in chat["messages"] if m["role"] == "assistant"][0]
    assert assistant["reasoning"] == "Thinking about echo."
    # the environment message comes as text blocks first and as a string after: the same chat message
    env = [anthropic_request.to_chat(b, ReplayMemory())[0]["messages"][2] for b in (first, second)]
    assert isinstance(first["messages"][1]["content"], list) and isinstance(second["messages"][1]["content"], str)
    assert env[0] == env[1]


def test_claude_code_title_call_is_aux_and_turns_are_agent() -> None:
    bodies = captured("claude-code", "title", "v1_messages")
    kinds = [classify_call(anthropic_request.to_chat(b, ReplayMemory())[0], preset_rules("claude-code"))
             for b in bodies]
    assert kinds == [("aux", "claude-code-title"), ("agent", None), ("agent", None)]
    assert [classify_call(anthropic_request.to_chat(b, ReplayMemory())[0]) for b in bodies] == kinds  # defaults too
    assert bodies[0]["model"] == "policy-model"  # the haiku-class call, pinned to the policy model


def test_claude_code_count_tokens_bodies_translate_without_sampling_fields() -> None:
    for body in captured("claude-code", "count_tokens", "count_tokens"):
        chat, _ = anthropic_request.to_chat(body, ReplayMemory(), count_only=True)
        assert chat["messages"] and "max_tokens" not in chat and "stream" not in chat


@pytest.mark.parametrize("scenario", ["basic", "reasoning", "compact"])
def test_codex_requests_translate(scenario: str) -> None:
    for body in captured("codex", scenario, "responses"):
        chat, call = responses_request.to_chat(body, ReplayMemory())
        assert chat["messages"][0]["role"] == "system"  # Codex's developer instructions
        assert "developer" not in {m["role"] for m in chat["messages"]}
        assert [t["function"]["name"] for t in chat.get("tools", [])] == [t["name"] for t in body["tools"]]
        calls = [c for m in chat["messages"] for c in m.get("tool_calls", [])]
        sent = [i for i in body["input"] if i.get("type") == "function_call"]
        assert [c["function"]["arguments"] for c in calls] == [i["arguments"] for i in sent]  # verbatim


def test_codex_reasoning_item_merges_into_its_assistant_turn() -> None:
    _, second = captured("codex", "reasoning", "responses")
    chat, _ = responses_request.to_chat(second, ReplayMemory())
    assistant = [m for m in chat["messages"] if m["role"] == "assistant"]
    assert len(assistant) == 1 and assistant[0]["reasoning"] == "Thinking about echo."
    assert assistant[0]["tool_calls"][0]["function"]["name"] == "exec_command"


def test_codex_compaction_is_aux() -> None:
    bodies = captured("codex", "compact", "responses")
    kinds = [classify_call(responses_request.to_chat(b, ReplayMemory())[0], preset_rules("codex")) for b in bodies]
    assert kinds == [("agent", None), ("aux", "codex-compaction")] * 2
    preset = get_preset("codex")
    compaction = responses_request.to_chat(bodies[1], ReplayMemory())[0]
    assert [r.name for r in preset.aux_rules if r.matches(compaction)] == ["codex-compaction"]


# -- the sampled argument text -------------------------------------------------------------------------------


def _reply(tokens: list[str], use_bytes: bool = True) -> dict:
    entries = [{"token": t, "logprob": -0.1, **({"bytes": list(t.encode())} if use_bytes else {})} for t in tokens]
    return {"choices": [{"logprobs": {"content": entries}}]}


def _calls(*arguments: str) -> list[dict]:
    return [{"function": {"name": "f", "arguments": a}} for a in arguments]


def test_sampled_text_from_bytes_or_token_strings() -> None:
    assert sampled_text(_reply(["<tool", "_call>", "é"])) == "<tool_call>é"
    assert sampled_text(_reply(["a", "b"], use_bytes=False)) == "ab"
    assert sampled_text(_reply(["token_id:5"], use_bytes=False)) is None
    assert sampled_text({"choices": [{}]}) is None and sampled_text(None) is None


def test_raw_arguments_finds_each_calls_own_text() -> None:
    text = ('<tool_call>\n{"name": "f", "arguments": {"cmd":"ls",  "n": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "f", "arguments": {"cmd" : "ls", "n": 1}}\n</tool_call>'
            '<tool_call>{"name": "g", "arguments": {}}</tool_call>')
    parsed = _calls('{"cmd": "ls", "n": 1}', '{"cmd": "ls", "n": 1}', "{}")
    assert raw_arguments(text, parsed) == ['{"cmd":"ls",  "n": 1}', '{"cmd" : "ls", "n": 1}', "{}"]
    assert raw_arguments(text, _calls('{"cmd": "rm"}')) == [None]  # not in the sampled text
    assert raw_arguments(text, _calls("not json", '["a"]')) == [None, None]
    assert raw_arguments(None, _calls("{}")) == [None]


# -- the replay memory --------------------------------------------------------------------------------------


def test_memory_restores_only_what_came_back_unchanged() -> None:
    memory = ReplayMemory()
    memory.remember_call("t1", '{"a":  1}', {"a": 1})
    assert memory.sampled_arguments("t1", {"a": 1}) == '{"a":  1}'
    assert memory.sampled_arguments("t1", {"a": 2}) is None
    assert memory.sampled_arguments("t2", {"a": 1}) is None
    memory.remember_reasoning("oeh1.x", "thought")
    assert memory.reasoning("oeh1.x") == "thought" and memory.reasoning("other") is None and memory.reasoning(None) is None


def test_memory_is_bounded_by_entries_and_bytes() -> None:
    memory = ReplayMemory(max_entries=3, max_bytes=100)
    for i in range(5):
        memory.remember_call(f"t{i}", "x" * 10, {})
    assert len(memory) == 3 and memory.sampled("t0") is None and memory.sampled("t4") == "x" * 10
    memory.remember_call("big", "y" * 90, {})
    assert memory.sampled("big") and memory.sampled("t2") is None  # 30 + 90 bytes: the oldest go
    memory.remember_reasoning("r", "z" * 200)  # larger than the whole budget: nothing else survives it
    assert memory.sampled("big") is None


def test_memory_trims_the_oldest_entry_of_either_kind() -> None:
    """Thinking on every turn must not push out the turn's own tool call (one age order for both)."""
    memory = ReplayMemory(max_entries=4)
    for i in range(10):
        memory.remember_reasoning(f"oeh1.{i}", f"thought {i}")
        memory.remember_call(f"t{i}", f"args {i}", {})
    assert len(memory) == 4
    assert [memory.sampled(f"t{i}") for i in (8, 9)] == ["args 8", "args 9"]
    assert memory.reasoning("oeh1.9") == "thought 9" and memory.reasoning("oeh1.7") is None
