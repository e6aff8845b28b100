"""The preset building blocks: aux rules, setup validation, launch specs, helpers."""

from __future__ import annotations

import hashlib

import pytest
from pydantic import ValidationError

from openenv_harness.harnesses.base import (
    API_KEY_ENV,
    AuxCondition,
    AuxRule,
    HarnessOptions,
    HarnessSetup,
    LaunchSpec,
    deep_merge,
    first_system_prompt,
    parse_jsonl,
)
from openenv_harness.sandbox.base import ModelEndpoint

TITLE = AuxRule(name="title", when=AuxCondition(no_tools=True, system_prompt_startswith="You are a title generator"))


def _setup(**overrides: object) -> HarnessSetup:
    values: dict[str, object] = {
        "endpoint": ModelEndpoint("http://127.0.0.1:9/rollout/s/v1/", "sk-test"),
        "model": "m",
        "workdir": "/sbx/workdir",
        "home": "/sbx/home",
    }
    values.update(overrides)
    return HarnessSetup(**values)  # type: ignore[arg-type]


def test_aux_rule_shapes() -> None:
    assert TITLE.as_data() == {
        "name": "title",
        "when": {"no_tools": True, "system_prompt_startswith": "You are a title generator"},
    }
    flat = {"name": "title", "no_tools": True, "system_prompt_startswith": "You are a title generator"}
    assert TITLE.as_flat() == flat
    with pytest.raises(ValidationError):
        AuxRule(name="x", when=AuxCondition(system_prompt_startswith=""))
    with pytest.raises(ValidationError, match="marker"):
        AuxCondition(no_tools=True)
    with pytest.raises(ValidationError):
        AuxRule.model_validate({"name": "x", "when": {"system_prompt_startswith": "a", "typo": 1}})


def test_aux_rule_matching() -> None:
    title = {"messages": [{"role": "system", "content": "You are a title generator. Output a title."}]}
    assert TITLE.matches(title)
    assert not TITLE.matches({**title, "tools": [{"type": "function"}]})
    parts = {"messages": [{"role": "system", "content": [{"type": "text", "text": "You are a title generator."}]}]}
    assert TITLE.matches(parts)
    user_first = {"messages": [{"role": "user", "content": "You are a title generator"}]}
    assert not TITLE.matches(user_first)
    assert not TITLE.matches({"messages": []})
    assert first_system_prompt({"messages": [{"role": "developer", "content": "dev"}]}) == "dev"


def test_aux_rule_markers_beyond_the_opening_words() -> None:
    title = AuxRule(name="t", when=AuxCondition(system_prompt_contains="naming a coding session"))
    assert title.as_flat() == {"name": "t", "no_tools": True, "system_prompt_contains": "naming a coding session"}
    assert title.matches({"messages": [{"role": "system", "content": "You are X. You are naming a coding session."}]})
    assert not title.matches({"messages": [{"role": "system", "content": "You are X."}]})
    compact = AuxRule(name="c", when=AuxCondition(last_user_message_startswith="Summarize"))
    body = {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"},
                         {"role": "user", "content": [{"type": "text", "text": "Summarize it"}]}]}
    assert compact.matches(body)
    assert not compact.matches({**body, "messages": body["messages"][:2]})


def test_setup_validation() -> None:
    assert _setup().base_url == "http://127.0.0.1:9/rollout/s/v1"
    with pytest.raises(ValueError, match="absolute"):
        _setup(workdir="relative/dir")
    with pytest.raises(ValueError, match="http"):
        _setup(endpoint=ModelEndpoint("127.0.0.1:9/v1", "k"))
    with pytest.raises(ValueError, match="below context_window"):
        _setup(context_window=4096, max_output_tokens=4096)
    with pytest.raises(ValueError, match="model"):
        _setup(model="")
    with pytest.raises(ValidationError):
        HarnessOptions(request_timeout_s=0)
    with pytest.raises(ValidationError):
        HarnessOptions.model_validate({"titel_call": True})


def test_launch_spec_hashes_and_redaction() -> None:
    spec = LaunchSpec(
        argv=["x"], env={API_KEY_ENV: "sk-secret", "A": "b"}, files={"/h/b.json": "{}", "/h/a.json": "é"}, cwd="/w"
    )
    hashes = spec.config_hashes()
    assert list(hashes) == ["/h/a.json", "/h/b.json"]
    assert hashes["/h/a.json"] == hashlib.sha256("é".encode()).hexdigest()
    assert spec.redacted_env() == {API_KEY_ENV: "<redacted>", "A": "b"}


def test_deep_merge_and_jsonl() -> None:
    base = {"a": {"b": 1, "c": 2}, "d": [1]}
    assert deep_merge(base, {"a": {"c": 3}, "d": [2], "e": None}) == {"a": {"b": 1, "c": 3}, "d": [2], "e": None}
    assert base == {"a": {"b": 1, "c": 2}, "d": [1]}
    assert parse_jsonl('{"a": 1}\nnot json\n[1]\n\x1b[0m{"b": 2}\n {"c": 3}\n{broken\n') == [{"a": 1}, {"c": 3}]


def test_a_system_prompt_suffix_goes_through_the_agents_own_flag_or_is_refused() -> None:
    from openenv_harness.harnesses.registry import get_preset

    suffix = "\n\nTo act, answer with one tool call."
    setup = _setup(options=HarnessOptions(system_prompt_suffix=suffix))
    for name in ("pi", "claude-code"):
        argv = get_preset(name).prepare(setup, "fix the bug").argv
        flag = argv.index("--append-system-prompt")
        assert argv[flag + 1] == suffix and flag == 1, argv
        assert argv[-1] == "fix the bug"  # the prompt stays where the CLI reads it
        assert "--append-system-prompt" not in get_preset(name).prepare(_setup(), "fix the bug").argv
    for name in ("opencode", "codex", "gemini-cli", "mini-swe-agent"):
        with pytest.raises(ValueError, match=f"{name} has no flag that appends to its system prompt"):
            get_preset(name).prepare(setup, "fix the bug")


def test_a_replaced_system_prompt_goes_through_the_agents_own_flag_or_file_or_is_refused() -> None:
    from openenv_harness.harnesses.registry import get_preset

    prompt = "You are a coding agent. Use the tools."
    setup = _setup(options=HarnessOptions(system_prompt=prompt))
    for name in ("pi", "claude-code"):
        spec = get_preset(name).prepare(setup, "fix the bug")
        assert spec.argv[1:3] == ["--system-prompt", prompt] and spec.argv[-1] == "fix the bug", spec.argv
    gemini = get_preset("gemini-cli").prepare(setup, "fix the bug")
    path = gemini.env["GEMINI_SYSTEM_MD"]
    assert path.startswith(setup.home + "/") and gemini.files[path] == prompt  # a file in the sandbox home
    assert "GEMINI_SYSTEM_MD" not in get_preset("gemini-cli").prepare(_setup(), "fix the bug").env
    for name in ("opencode", "codex"):
        with pytest.raises(ValueError, match=f"{name} has no way to replace its system prompt"):
            get_preset(name).prepare(setup, "fix the bug")
