"""The registry, and the presets' aux rules checked against requests captured from the real CLIs."""

from __future__ import annotations

from typing import Any

import pytest

from openenv_harness.harnesses import UnknownHarnessError, get_preset, list_presets, preset_names


def test_lookup() -> None:
    assert preset_names() == ["claude-code", "codex", "gemini-cli", "kilo", "opencode", "pi"]
    assert [p.name for p in list_presets()] == preset_names()
    assert get_preset("pi").npm_spec == "@mariozechner/pi-coding-agent@0.73.1"
    assert get_preset("opencode").npm_spec == "opencode-ai@1.18.33"
    assert get_preset("codex").npm_spec == "@openai/codex@0.171.0"
    assert get_preset("claude-code").npm_spec == "@anthropic-ai/claude-code@2.1.332"
    assert get_preset("gemini-cli").npm_spec == "@google/gemini-cli@0.61.0"
    assert get_preset("kilo").npm_spec == "@kilocode/cli@7.7.7"
    assert [(p.name, p.dialect) for p in list_presets()] == [
        ("claude-code", "anthropic"), ("codex", "responses"), ("gemini-cli", "gemini"), ("kilo", "chat"),
        ("opencode", "chat"), ("pi", "chat")]
    with pytest.raises(UnknownHarnessError, match="known harnesses: claude-code, codex, gemini-cli, kilo, opencode, pi"):
        get_preset("claude")


def _body(call: dict[str, Any]) -> dict[str, Any]:
    tools = [{"type": "function", "function": {"name": name}} for name in call["tools"]]
    return {"messages": [{"role": "system", "content": call["system_prompt_head"]}], "tools": tools}


def test_aux_rules_classify_captured_calls(captured_calls: list[dict[str, Any]]) -> None:
    assert {c["aux_rule"] for c in captured_calls} == {None, "opencode-title", "opencode-compaction", "pi-compaction"}
    for call in captured_calls:
        preset = get_preset(call["harness"])
        matched = [rule.name for rule in preset.aux_rules if rule.matches(_body(call))]
        assert matched == ([call["aux_rule"]] if call["aux_rule"] else []), call["capture"]


def test_gemini_cli_compression_rule_matches_its_translated_calls() -> None:
    from openenv_harness.harnesses.gemini_cli import COMPRESSION_MARKER
    from openenv_harness.recorder.dialects.gemini_request import to_chat
    from openenv_harness.recorder.dialects.memory import ReplayMemory

    [rule] = get_preset("gemini-cli").aux_rules
    prompt = f"You are a specialized system component responsible for {COMPRESSION_MARKER}.\n..."
    history = [{"role": "user", "parts": [{"text": "fix it"}]}, {"role": "model", "parts": [{"text": "ok"}]}]
    summary, _ = to_chat({"systemInstruction": {"text": prompt}, "contents": history}, ReplayMemory(),
                         model="m", stream=False)
    assert rule.matches(summary)
    agent_call, _ = to_chat({"systemInstruction": {"parts": [{"text": "You are Gemini CLI."}]}, "contents": history,
                             "tools": [{"functionDeclarations": [{"name": "run_shell_command"}]}]},
                            ReplayMemory(), model="m", stream=False)
    assert not rule.matches(agent_call)
    assert not rule.matches({**summary, "tools": agent_call["tools"]})


def test_aux_rules_are_plain_data() -> None:
    for preset in list_presets():
        for data in preset.aux_rules_data():
            assert set(data) == {"name", "when"}
            markers = {"system_prompt_startswith", "system_prompt_contains", "last_user_message_startswith"}
            assert set(data["when"]) - {"no_tools"} <= markers and set(data["when"]) & markers
            assert data["when"]["no_tools"] is True
