"""The scripted policy: stateless turn choice, exact sampled text, deterministic ids and logprobs."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from openenv_harness.testing.engine.policy import (
    LOGPROB_MAX,
    LOGPROB_MIN,
    Script,
    ToolCallSpec,
    Turn,
    choose_turn,
    sample_turn,
    token_logprob,
    turn_index,
)
from openenv_harness.testing.engine.template import reference_template
from openenv_harness.testing.engine.tokenizer import IM_END, is_noncanonical, reference_tokenizer

TOOLS = [{"type": "function", "function": {"name": "bash"}}]
SCRIPT = Script(turns=[
    Turn(tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls"})]),
    Turn(content="Found two files."),
])


def _sample(turn: Turn, script: Script | None = None, max_tokens: int | None = None, key: str = "k"):
    script = script or Script(turns=[turn])
    choice = choose_turn({"tools": TOOLS, "messages": [{"role": "user", "content": "go"}]}, script)
    return sample_turn(choice, script, key, reference_tokenizer(), reference_template(), max_tokens)


def test_turn_index_counts_assistant_messages_after_the_last_user_message() -> None:
    user, assistant, tool = {"role": "user"}, {"role": "assistant"}, {"role": "tool"}
    assert turn_index([user]) == 0
    assert turn_index([user, assistant, tool, assistant, tool]) == 2
    assert turn_index([user, assistant, tool, user]) == 0
    assert turn_index([assistant, assistant]) == 2


def test_choice_follows_the_script_then_the_final_text() -> None:
    messages = [{"role": "user", "content": "go"}]
    first = choose_turn({"tools": TOOLS, "messages": messages}, SCRIPT)
    assert (first.kind, first.index) == ("agent", 0) and first.turn.tool_calls[0].name == "bash"
    later = messages + [{"role": "assistant"}, {"role": "tool"}, {"role": "assistant"}, {"role": "tool"}]
    final = choose_turn({"tools": TOOLS, "messages": later}, SCRIPT)
    assert (final.kind, final.index, final.turn.content) == ("final", 2, "Done.")
    looping = choose_turn({"tools": TOOLS, "messages": later}, SCRIPT.model_copy(update={"repeat_last": True}))
    assert (looping.kind, looping.turn.content) == ("agent", "Found two files.")


def test_calls_without_tools_get_the_aux_answer_unless_scripted() -> None:
    body = {"messages": [{"role": "user", "content": "Generate a title"}]}
    aux = choose_turn(body, SCRIPT)
    assert (aux.kind, aux.index, aux.turn.content) == ("aux", -1, "Tool run summary")
    scripted = choose_turn(body, SCRIPT.model_copy(update={"aux_text": None}))
    assert (scripted.kind, scripted.index) == ("agent", 0)


def test_natural_stop_ends_with_the_end_of_turn_id() -> None:
    sample = _sample(Turn(content="Found two files."))
    tok = reference_tokenizer()
    assert sample.text == "Found two files." + IM_END
    assert sample.token_ids[-1] == tok.im_end_id
    assert sample.token_ids == tok.encode(sample.text)
    assert sample.finish_reason == "stop"


def test_length_turns_and_max_tokens_truncate_without_end_of_turn() -> None:
    tok = reference_tokenizer()
    scripted = _sample(Turn(content="Found two files.", finish_reason="length"))
    assert scripted.finish_reason == "length" and tok.im_end_id not in scripted.token_ids
    capped = _sample(Turn(content="Found two files and a directory."), max_tokens=3)
    assert capped.finish_reason == "length" and len(capped.token_ids) == 3
    assert capped.token_ids == tok.encode("Found two files and a directory.")[:3]


def test_raw_string_arguments_are_sampled_verbatim() -> None:
    raw = '{"command":  "ls",  "timeout" : 5}'
    sample = _sample(Turn(tool_calls=[ToolCallSpec(name="bash", arguments=raw)]))
    assert sample.text == f'<tool_call>\n{{"name": "bash", "arguments": {raw}}}\n</tool_call>{IM_END}'


def test_object_arguments_are_spaced_like_tojson_unless_asked_compact() -> None:
    turn = Turn(tool_calls=[ToolCallSpec(name="bash", arguments={"command": "ls"})])
    assert '{"command": "ls"}' in _sample(turn).text  # what vLLM re-renders from parsed arguments
    compact = Script(turns=[turn], arguments_format="compact")
    assert '{"command":"ls"}' in _sample(turn, compact).text


def test_noncanonical_segmentation_keeps_the_text() -> None:
    turn = Turn(content="I will run the command and check the output.")
    canonical = _sample(turn)
    odd = _sample(turn, Script(turns=[turn], segmentation="noncanonical"))
    tok = reference_tokenizer()
    assert odd.text == canonical.text
    assert tok.decode(odd.token_ids) == canonical.text
    assert odd.token_ids != canonical.token_ids and is_noncanonical(tok, odd.token_ids)
    assert len(odd.logprobs) == len(odd.token_ids)


def test_logprobs_are_deterministic_finite_and_bounded() -> None:
    first, again = _sample(Turn(content="Same text.")), _sample(Turn(content="Same text."))
    assert first.logprobs == again.logprobs
    other_key = _sample(Turn(content="Same text."), key="other")
    assert other_key.logprobs != first.logprobs
    values = [token_logprob("k", i, p, t) for i in range(3) for p in range(50) for t in (5, 900)]
    assert all(math.isfinite(v) and LOGPROB_MIN <= v <= LOGPROB_MAX for v in values)
    assert len(set(values)) > len(values) * 0.9


def test_scripts_reject_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        Script.model_validate({"turns": [{"contents": "typo"}]})
    with pytest.raises(ValidationError):
        ToolCallSpec.model_validate({"name": "", "arguments": {}})
