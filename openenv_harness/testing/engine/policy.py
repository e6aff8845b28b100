"""The scripted policy: which assistant turn the reference engine "samples", and its token ids.

Why scripted and stateless: tests need to know exactly what the model will say, and a retried
request must get the same answer as the original. The turn is therefore chosen from the request
alone -- the number of assistant messages after the last user message -- and everything about
it (text, ids, logprobs) is a pure function of the script, the key and that index.

The sampled text of a turn is exactly what the served template renders for the assistant
message (see ``ChatTemplate.render_sampled_turn``), so an agent that echoes the turn back
byte-identically extends the prompt token for token. Object arguments are sampled as the
template's ``tojson`` writes them (``{"command": "ls"}``: what vLLM re-renders after parsing an
agent's replayed string, so the replay stays clean); a raw string is sampled verbatim where the
template prints string arguments as given, which is the replay drift real models show when they
emit odd spacing.
"""

from __future__ import annotations

import hashlib
import json
import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field

from openenv_harness.testing.engine.faults import Fault
from openenv_harness.testing.engine.messages import prepare_messages
from openenv_harness.testing.engine.template import ChatTemplate
from openenv_harness.testing.engine.tokenizer import ReferenceTokenizer

LOGPROB_MIN = -4.0
LOGPROB_MAX = -0.001


class ToolCallSpec(BaseModel):
    """A tool call the model will make. A string ``arguments`` is sampled exactly as written."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class Turn(BaseModel):
    """One scripted assistant turn."""

    model_config = ConfigDict(extra="forbid")

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallSpec] = Field(default_factory=list)
    finish_reason: Literal["stop", "length"] = "stop"
    fault: Fault | None = Field(None, description="Injected once (or fault.count times) when this turn is served")


class Script(BaseModel):
    """What the model says across an episode, plus how it says it."""

    model_config = ConfigDict(extra="forbid")

    turns: list[Turn] = Field(default_factory=list)
    segmentation: Literal["canonical", "noncanonical"] = "canonical"
    repeat_last: bool = Field(False, description="Serve the last turn forever (budget tests)")
    final_text: str = Field("Done.", description="Answer once the turns run out")
    aux_text: str | None = Field(
        "Tool run summary", description="Answer to calls without tools (titles, summaries); None scripts them too"
    )
    arguments_format: Literal["compact", "spaced"] = Field(
        "spaced",
        description="How object arguments are sampled: spaced JSON is what vLLM re-renders from parsed "
        "arguments (and what a byte-identical echo gives back); compact JSON survives an agent's "
        "re-serialization only on an engine that renders string arguments verbatim",
    )


@dataclass(frozen=True)
class TurnChoice:
    """Which turn a request gets; ``index`` is -1 for an auxiliary answer."""

    kind: Literal["agent", "aux", "final"]
    index: int
    turn: Turn


@dataclass(frozen=True)
class Sample:
    """A sampled completion: ids end with ``<|im_end|>`` on a natural stop."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    choice: TurnChoice


def turn_index(messages: list[dict[str, Any]]) -> int:
    """Assistant messages after the last user message (all of them when there is no user message)."""
    count = 0
    for message in reversed(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "user":
            break
        if role == "assistant":
            count += 1
    return count


def choose_turn(body: dict[str, Any], script: Script) -> TurnChoice:
    """The turn this request gets; a pure function of the request and the script."""
    if not body.get("tools") and script.aux_text is not None:
        return TurnChoice("aux", -1, Turn(content=script.aux_text))
    index = turn_index(body.get("messages") or [])
    if index < len(script.turns):
        return TurnChoice("agent", index, script.turns[index])
    if script.repeat_last and script.turns:
        return TurnChoice("agent", index, script.turns[-1])
    return TurnChoice("final", index, Turn(content=script.final_text))


def turn_message(turn: Turn, arguments_format: Literal["compact", "spaced"] = "compact") -> dict[str, Any]:
    """The assistant message whose rendering is the turn's sampled text."""
    separators = (",", ":") if arguments_format == "compact" else (", ", ": ")
    calls = []
    for call in turn.tool_calls:
        arguments = call.arguments
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False, separators=separators)
        calls.append({"type": "function", "function": {"name": call.name, "arguments": arguments}})
    message: dict[str, Any] = {"role": "assistant", "content": turn.content or ""}
    if turn.reasoning:
        message["reasoning"] = turn.reasoning
    if calls:
        message["tool_calls"] = calls
    return message


def token_logprob(key: str, index: int, position: int, token_id: int) -> float:
    """A deterministic, finite logprob in [LOGPROB_MIN, LOGPROB_MAX]."""
    digest = hashlib.blake2b(f"{key}\x1f{index}\x1f{position}\x1f{token_id}".encode(), digest_size=8).digest()
    unit = int.from_bytes(digest, "big") / 2**64
    return LOGPROB_MAX + unit * (LOGPROB_MIN - LOGPROB_MAX)


def noncanonical_ids(tokenizer: ReferenceTokenizer, ids: list[int]) -> list[int]:
    """Split some merged tokens into their two parts: same text, ids ``encode`` would never return.

    Every other position is split where the token has a merge; if that split nothing, the first
    splittable token is. A text with no merged token at all stays canonical.
    """
    result: list[int] = []
    changed = False
    for position, token_id in enumerate(ids):
        parts = tokenizer.split(token_id) if position % 2 == 0 else None
        if parts is None:
            result.append(token_id)
        else:
            result.extend(parts)
            changed = True
    if changed:
        return result
    for position, token_id in enumerate(ids):
        parts = tokenizer.split(token_id)
        if parts is not None:
            return ids[:position] + list(parts) + ids[position + 1 :]
    return list(ids)


def _with_object_arguments(message: dict[str, Any]) -> dict[str, Any]:
    calls = []
    for call in message.get("tool_calls", []):
        arguments = call["function"]["arguments"]
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
        calls.append({**call, "function": {**call["function"], "arguments": arguments}})
    return {**message, "tool_calls": calls} if calls else message


def sampled_text(template: ChatTemplate, turn: Turn, arguments_format: Literal["compact", "spaced"]) -> str:
    """What the model writes for ``turn`` under ``template``, end-of-turn token included.

    The message reaches the template as vLLM would hand it over (reasoning under both names,
    content in the template's format). Arguments are handed over as strings where the template
    prints them verbatim (so a script controls the exact text); templates that expect objects
    (Qwen2.5's ``tojson``, Qwen3.5's parameter list) get the parsed objects.
    """
    [message] = prepare_messages([turn_message(turn, arguments_format)], content_format=template.content_format,
                                 tool_arguments="verbatim")  # reasoning under both names, content as the template reads it
    if not message.get("tool_calls"):
        return template.render_sampled_turn(message)
    try:
        text = template.render_sampled_turn(message)
    except (TemplateError, TypeError, AttributeError):
        text = ""  # the template cannot print string arguments at all
    if all(c["function"]["arguments"] in text for c in message["tool_calls"]):
        return text
    return template.render_sampled_turn(_with_object_arguments(message))


def sample_turn(
    choice: TurnChoice,
    script: Script,
    key: str,
    tokenizer: ReferenceTokenizer,
    template: ChatTemplate,
    max_tokens: int | None,
) -> Sample:
    """The completion for ``choice``: text, ids and logprobs, truncated to ``max_tokens``."""
    text = sampled_text(template, choice.turn, script.arguments_format)
    finish: Literal["stop", "length"] = choice.turn.finish_reason
    if finish == "length":
        text = text[: -len(template.eos_text)]
    ids = tokenizer.encode(text)
    if script.segmentation == "noncanonical":
        ids = noncanonical_ids(tokenizer, ids)
    if max_tokens is not None and len(ids) > max_tokens:
        ids = ids[:max_tokens]
        finish = "length"
        text = tokenizer.decode(ids)
    logprobs = [token_logprob(key, choice.index, pos, tid) for pos, tid in enumerate(ids)]
    return Sample(text, ids, logprobs, finish, choice)


def logprob_scale(logprobs_mode: str, temperature: float) -> float:
    """What the engine's reported logprobs are, relative to the scripted (temperature 1) ones: raw
    logprobs (vLLM's default) ignore the temperature; processed logprobs are of the distribution sampled
    from, whose log-probability gaps divide by it. Greedy decoding (temperature 0) reports raw values."""
    if logprobs_mode == "processed_logprobs" and temperature > 0:
        return 1.0 / temperature
    return 1.0


def as_reported(sample: Sample, scale: float) -> Sample:
    """The sample with its logprobs as the engine reports them (``logprob_scale``)."""
    if scale == 1.0:
        return sample
    return dataclasses.replace(sample, logprobs=[value * scale for value in sample.logprobs])
