"""What a local stack gives each agent on the project's real engine, decided before anything starts:
constrained (``demo-real``: tool calls required) or unconstrained (a training sampling policy: the
model's tool-call hint through the agent's own flag, no tool_choice pinned)."""

from __future__ import annotations

from openenv_harness.cli.stack import REAL_ENGINE_OPTIONS, LocalStack, real_engine_sampling
from openenv_harness.engine.model import QWEN25_CODER_05B


def _stack(**kw: object) -> LocalStack:
    return LocalStack(**{"engine_url": None, "store_path": "/tmp/unused.db", "model": None, "tasks": [], **kw})  # type: ignore[arg-type]


def test_unconstrained_agents_get_the_models_hint_where_their_cli_can_take_it() -> None:
    stack = _stack(engine="vllm", unconstrained=True)
    pi = stack.options_for("pi")
    assert pi is not None and pi.system_prompt_suffix == QWEN25_CODER_05B.tool_call_hint
    claude = stack.options_for("claude-code")
    assert claude is not None and claude.system_prompt_suffix == QWEN25_CODER_05B.tool_call_hint
    assert claude.extra_args == REAL_ENGINE_OPTIONS["claude-code"].extra_args  # its real-engine options stay
    assert stack.options_for("opencode") is None  # no flag for it: the agent runs as it is


def test_constrained_and_other_engines_get_no_hint_unless_one_is_given() -> None:
    assert _stack(engine="vllm").options_for("pi") is None
    assert _stack(engine_url="http://engine").options_for("pi") is None
    given = _stack(engine_url="http://engine", system_prompt_suffix="\nBe brief.").options_for("pi")
    assert given is not None and given.system_prompt_suffix == "\nBe brief."


def test_the_real_engine_pins_tool_choice_only_when_constrained() -> None:
    assert real_engine_sampling(unconstrained=False)["tool_choice"] == "required"
    free = real_engine_sampling(unconstrained=True)
    assert "tool_choice" not in free and free["max_tokens"] == 256
