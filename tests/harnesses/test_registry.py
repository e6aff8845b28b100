"""The registry, and the presets' aux rules checked against requests captured from the real CLIs."""

from __future__ import annotations

from typing import Any

import pytest

from openenv_harness.harnesses import UnknownHarnessError, get_preset, list_presets, preset_names


#: every preset: its pinned package (npm, or PyPI) and the dialect it speaks
EXPECTED = {
    "claude-code": ("@anthropic-ai/claude-code@2.1.332", "anthropic"),
    "cline": ("cline@3.0.65", "chat"),
    "codex": ("@openai/codex@0.171.0", "responses"),
    "continue": ("@continuedev/cli@1.5.47", "chat"),
    "gemini-cli": ("@google/gemini-cli@0.61.0", "gemini"),
    "grok-cli": ("@vibe-kit/grok-cli@0.0.34", "chat"),
    "kilo": ("@kilocode/cli@7.7.7", "chat"),
    "mini-swe-agent": ("mini-swe-agent==2.4.6", "chat"),  # PyPI, into a venv of its own
    "opencode": ("opencode-ai@1.18.33", "chat"),
    "pi": ("@mariozechner/pi-coding-agent@0.73.1", "chat"),
    "qwen-code": ("@qwen-code/qwen-code@0.24.4", "chat"),
}


def test_lookup() -> None:
    assert preset_names() == sorted(EXPECTED)
    assert [p.name for p in list_presets()] == preset_names()
    assert {p.name: (p.install_spec, p.dialect) for p in list_presets()} == EXPECTED
    assert get_preset("grok-cli").version_output == "1.0.1", "its --version prints a hard-coded string"
    with pytest.raises(UnknownHarnessError, match="known harnesses: " + ", ".join(sorted(EXPECTED))):
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
            # a call that offers tools is aux only by the agent's own marker in its last user message
            # (Continue's compaction keeps its tools)
            assert data["when"]["no_tools"] is True or "last_user_message_startswith" in data["when"]
