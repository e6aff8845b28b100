"""Reading roles and open think blocks from id prompts turn by turn gives what decoding all of it gave."""

from __future__ import annotations

import random
from typing import Any

from openenv_harness.testing.engine import EngineConfig
from openenv_harness.testing.engine.prompt import render_prompt
from openenv_harness.testing.engine.prompt_reading import PromptReader, turn_body_from_text
from openenv_harness.testing.engine.state import EngineState
from openenv_harness.testing.engine.tokenizer import THINK_CLOSE, THINK_OPEN

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
TEXTS = ["ran\n", "héllo wörld — 日本語 ✓", "<tool_response>literal</tool_response>", "", "user\nnot a header",
         "\n<tools>\n in a message", "ok"]


def _conversation(rng: random.Random) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.7:
        messages.append({"role": "system", "content": rng.choice(TEXTS)})
    messages.append({"role": "user", "content": rng.choice(TEXTS)})
    for n in range(rng.randrange(0, 6)):
        assistant: dict[str, Any] = {"role": "assistant", "content": rng.choice(TEXTS)}
        if rng.random() < 0.3:
            assistant["reasoning_content"] = rng.choice(TEXTS)
        if rng.random() < 0.6:
            assistant["tool_calls"] = [{"id": f"c{n}", "type": "function",
                                        "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]
            messages += [assistant, {"role": "tool", "tool_call_id": f"c{n}", "content": rng.choice(TEXTS)}]
        else:
            messages += [assistant, {"role": "user", "content": rng.choice(TEXTS)}]
    return messages


def _old_think_open(state: EngineState, ids: list[int]) -> bool:
    prompt = state.tokenizer.decode(ids) if ids else ""
    tail = prompt[prompt.rfind(THINK_OPEN):] if THINK_OPEN in prompt else ""
    return bool(tail) and THINK_CLOSE not in tail


def _prompts(state: EngineState, rng: random.Random) -> list[list[int]]:
    out = []
    for _ in range(60):
        ids = render_prompt(state.config, state.template, state.tokenizer, messages=_conversation(rng),
                            tools=TOOLS if rng.random() < 0.6 else None,
                            add_generation_prompt=rng.random() < 0.8, chat_template_kwargs=None, route="chat").ids
        out.append(ids)
        out.append(ids[:rng.randrange(0, len(ids) + 1)])  # cut anywhere: mid-header, mid-character
        out.append(ids + state.tokenizer.encode(rng.choice([THINK_OPEN + "hm", THINK_OPEN + "a" + THINK_CLOSE, "x"])))
    out += [[], [rng.randrange(state.tokenizer.vocab_size) for _ in range(300)]]
    return out


def test_turn_by_turn_reading_equals_the_whole_decode_and_survives_its_memo() -> None:
    _assert_reading_equals_the_whole_decode(EngineState(EngineConfig()), think_ids=True)


def test_the_same_holds_for_the_real_qwen_tokenizer() -> None:
    from openenv_harness.engine import engine_home, prepared_model_dir

    folder = prepared_model_dir(engine_home())
    assert folder is not None, "the real model is not installed: run ./dev setup"
    # Qwen2.5 has no <think> token: its open think blocks are found in the decoded prompt
    _assert_reading_equals_the_whole_decode(EngineState(EngineConfig(tokenizer=folder)), think_ids=False)


def _assert_reading_equals_the_whole_decode(state: EngineState, think_ids: bool) -> None:
    reader = PromptReader(state.tokenizer)
    assert reader._im_start is not None  # turns are read one by one
    assert (reader._think_open is not None) == think_ids
    prompts = _prompts(state, random.Random(17))
    for _ in range(2):  # the second pass reads every turn from the memo
        for ids in prompts:
            assert reader.turn_body(ids) == turn_body_from_text(state.tokenizer.decode(ids)), ids
            assert reader.think_open(ids) == _old_think_open(state, ids), ids
    assert any(turn_body_from_text(state.tokenizer.decode(ids))["tools"] for ids in prompts)
    assert any(_old_think_open(state, ids) for ids in prompts) and not all(_old_think_open(state, i) for i in prompts)
    assert any(m["role"] == "tool" for ids in prompts for m in reader.turn_body(ids)["messages"])


def test_the_reading_of_a_turn_depends_on_all_its_ids() -> None:
    """A memo keyed too loosely would answer a new turn with an old one's reading."""
    state = EngineState(EngineConfig())
    reader = PromptReader(state.tokenizer)
    user = render_prompt(state.config, state.template, state.tokenizer, messages=[{"role": "user", "content": "a"}],
                         tools=None, add_generation_prompt=True, chat_template_kwargs=None, route="chat").ids
    tool = render_prompt(state.config, state.template, state.tokenizer,
                         messages=[{"role": "user", "content": "a"},
                                   {"role": "assistant", "content": "", "tool_calls": [
                                       {"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
                                   {"role": "tool", "tool_call_id": "c", "content": "a"}],
                         tools=TOOLS, add_generation_prompt=True, chat_template_kwargs=None, route="chat").ids
    assert [m["role"] for m in reader.turn_body(user)["messages"]] == ["user"]
    assert [m["role"] for m in reader.turn_body(tool)["messages"]] == ["system", "user", "assistant", "tool"]
    assert reader.turn_body(tool)["tools"] == [{}] and reader.turn_body(user)["tools"] is None
