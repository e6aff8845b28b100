"""Aux/agent tagging on the requests the real CLIs actually sent (captured)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openenv_harness.recorder.classify import DEFAULT_AUX_RULES, classify_call, system_prompt
from openenv_harness.recorder.session.spec import AuxRule

CAPTURES = Path(__file__).resolve().parents[1] / "data" / "harness_capture"


def load(harness: str, scenario: str) -> list[dict]:
    files = sorted((CAPTURES / harness / scenario / "requests").glob("*.json"))
    assert files, f"no captures for {harness}/{scenario}"
    return [json.loads(f.read_text())["body"] for f in files]


def kinds(bodies: list[dict]) -> list[tuple[str, str | None]]:
    return [classify_call(b) for b in bodies]


def test_opencode_basic_title_call_is_aux() -> None:
    got = kinds(load("opencode", "basic"))
    assert ("aux", "opencode-title") in got
    assert [k for k, _ in got].count("agent") == 2


def test_opencode_compaction_is_aux() -> None:
    got = kinds(load("opencode", "compact1"))
    assert ("aux", "opencode-compaction") in got
    assert any(k == "agent" for k, _ in got)


def test_pi_calls() -> None:
    assert [k for k, _ in kinds(load("pi", "basic"))] == ["agent", "agent"]
    got = kinds(load("pi", "compact"))
    assert ("aux", "pi-compaction") in got


def test_reasoning_capture_keeps_agent_calls_agent() -> None:
    got = kinds(load("opencode", "reasoning"))
    assert sum(1 for k, _ in got if k == "agent") >= 2


def test_override_rules() -> None:
    body = load("pi", "basic")[0]
    assert classify_call(body, [AuxRule(name="model", model=body["model"])]) == ("aux", "model")
    assert classify_call(body, []) == ("agent", None)
    no_tools = {"messages": [{"role": "user", "content": "hi"}]}
    assert classify_call(no_tools) == ("aux", "no-tools")
    assert classify_call(no_tools, [r for r in DEFAULT_AUX_RULES if r.name != "no-tools"]) == ("agent", None)


@pytest.mark.parametrize("content, expected", [
    ("plain", "plain"),
    ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "ab"),
    (None, ""),
])
def test_system_prompt_forms(content, expected) -> None:
    assert system_prompt({"messages": [{"role": "system", "content": content}]}) == expected
    assert system_prompt({"messages": [{"role": "user", "content": "x"}]}) == ""
