"""vLLM's chat-completions wire format: non-streamed bodies and SSE chunks.

Why a module of its own: the whole point of the reference engine is that its bytes look like a
real vLLM 0.32 server's, so every field, its presence and its null-ness is decided here and
nowhere else (``tests/real_engine/test_engine_conformance.py`` holds it to the real one). Notable
vLLM behaviours reproduced:

- ``return_token_ids`` adds a top-level ``prompt_token_ids`` and ``choices[i].token_ids``; the
  completion ids include the end-of-turn id on a natural stop, while the text excludes it.
- fields a plain OpenAI server does not send: top-level ``prompt_text`` (with
  ``return_prompt_text``), ``kv_transfer_params``, ``ec_transfer_params``, ``metrics``,
  ``prompt_logprobs``; per choice ``stop_reason`` and ``routed_experts``; the message's
  ``refusal``/``annotations``/``audio``/``function_call``/``reasoning`` nulls; ``usage``'s
  ``prompt_tokens_details``/``completion_tokens_details``; a ``system_fingerprint`` string.
- ``logprobs.content[j] = {token, logprob, bytes, top_logprobs}``; with token-ids-as-tokens the
  token strings are ``"token_id:N"``. ``top_logprobs`` lists the sampled token first.
- streaming: a first chunk with the role, ``content: ""``, ``prompt_token_ids`` and
  ``prompt_text``; then one chunk per sampled token carrying its ``token_ids`` (see ``deltas`` for
  what each delta holds); the finish reason and ``stop_reason`` on the chunk of the last token
  (with ``system_fingerprint`` when no usage chunk follows); an optional usage chunk with
  ``choices: []`` and the ``system_fingerprint``; then ``data: [DONE]``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from openenv_harness.testing.engine.deltas import token_deltas
from openenv_harness.testing.engine.parser import ParsedOutput, ToolParser, parse_output
from openenv_harness.testing.engine.policy import token_logprob
from openenv_harness.testing.engine.tokenizer import ReferenceTokenizer

_NAN_MARK = "__openenv_reference_nan__"


def new_id(prefix: str = "chatcmpl-") -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def dumps(obj: Any) -> bytes:
    """orjson, except that a marked logprob becomes a bare ``NaN`` (what Python's json emits)."""
    data = orjson.dumps(obj)
    if _NAN_MARK.encode() in data:
        data = data.replace(f'"{_NAN_MARK}"'.encode(), b"NaN")
    return data


@dataclass
class ReplySpec:
    """Everything about one reply that is decided before its first byte."""

    request_id: str
    created: int
    model: str
    key: str
    turn_index: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    system_fingerprint: str = ""
    prompt_text: str | None = None
    return_token_ids: bool = False
    want_logprobs: bool = False
    top_logprobs: int = 0
    #: the reported logprobs over the scripted ones (``policy.logprob_scale``): the alternatives scale alike
    logprob_scale: float = 1.0
    tokens_as_ids: bool = False
    reasoning_field: str = "reasoning"
    parse_tools: bool = False
    tool_choice_required: bool = False
    tool_parser: ToolParser = "hermes"
    parse_reasoning: bool = True
    open_think: bool = False
    include_usage: bool = False
    missing_token_ids: bool = False
    logprob_mismatch: bool = False
    usage_mismatch: bool = False
    nan_logprob: bool = False
    tool_call_ids: list[str] = field(default_factory=list)
    #: vLLM 0.33+: every choice has ``weight_versions`` (null unless the request asked for the spans)
    weight_versions_key: bool = False
    #: the weight-version label to report spans under, when asked (``return_weight_versions``)
    weight_versions: str | None = None


def output_text(tokenizer: ReferenceTokenizer, ids: list[int]) -> str:
    """Decoded completion text with special tokens skipped (vLLM's default)."""
    special = tokenizer.special_ids
    data = b"".join(tokenizer.token_bytes[i] for i in ids if i not in special)
    return data.decode("utf-8", errors="replace")


def parse_reply(spec: ReplySpec, text: str) -> ParsedOutput:
    return parse_output(text, spec.parse_tools, tool_parser=spec.tool_parser, reasoning=spec.parse_reasoning,
                        open_think=spec.open_think)


def _logprob_value(spec: ReplySpec, position: int) -> float | str:
    if spec.nan_logprob and position == len(spec.token_ids) // 2:
        return _NAN_MARK
    return spec.logprobs[position]


def _top_entries(tokenizer: ReferenceTokenizer, spec: ReplySpec, position: int) -> list[dict[str, Any]]:
    """``top_logprobs`` alternatives: the sampled token, then other ids with lower logprobs."""
    if spec.top_logprobs <= 0:
        return []
    sampled = spec.token_ids[position]
    entries: list[tuple[int, float]] = [(sampled, spec.logprobs[position])]
    step = 1
    while len(entries) < spec.top_logprobs:
        alternative = (sampled + step * 977) % tokenizer.vocab_size
        step += 1
        if alternative == sampled:
            continue
        raw = token_logprob(spec.key, spec.turn_index, position, alternative) * spec.logprob_scale
        value = min(raw, spec.logprobs[position]) - 0.25 * spec.logprob_scale
        entries.append((alternative, value))
    result = []
    for token_id, value in entries:
        token = f"token_id:{token_id}" if spec.tokens_as_ids else tokenizer.token_texts[token_id]
        result.append({"token": token, "logprob": value, "bytes": list(token.encode("utf-8", errors="replace"))})
    return result


def logprob_entry(tokenizer: ReferenceTokenizer, spec: ReplySpec, position: int) -> dict[str, Any]:
    token_id = spec.token_ids[position]
    decoded = tokenizer.token_texts[token_id]
    return {
        "token": f"token_id:{token_id}" if spec.tokens_as_ids else decoded,
        "logprob": _logprob_value(spec, position),
        "bytes": list(decoded.encode("utf-8", errors="replace")),
        "top_logprobs": _top_entries(tokenizer, spec, position),
    }


def usage(spec: ReplySpec, completion_tokens: int) -> dict[str, Any]:
    reported = completion_tokens + (1 if spec.usage_mismatch else 0)
    prompt = len(spec.prompt_ids)
    return {"prompt_tokens": prompt, "total_tokens": prompt + reported, "completion_tokens": reported}


def _ensure_tool_call_ids(spec: ReplySpec, parsed: ParsedOutput) -> None:
    while len(spec.tool_call_ids) < len(parsed.tool_calls):
        spec.tool_call_ids.append(new_id("chatcmpl-tool-"))


def _finish_reason(spec: ReplySpec, parsed: ParsedOutput, streamed: bool) -> str:
    """vLLM reports ``tool_calls`` when tools were parsed: in a stream (and under ``tool_choice:
    "required"``) only when the model stopped by itself, otherwise whatever ended it."""
    stopped = spec.finish_reason == "stop"
    if parsed.tool_calls and (stopped or not (streamed or spec.tool_choice_required)):
        return "tool_calls"
    return spec.finish_reason


def completion_body(tokenizer: ReferenceTokenizer, spec: ReplySpec, emitted: int) -> dict[str, Any]:
    """The non-streamed ``chat.completion`` for the first ``emitted`` sampled tokens."""
    ids = spec.token_ids[:emitted]
    parsed = parse_reply(spec, output_text(tokenizer, ids))
    _ensure_tool_call_ids(spec, parsed)
    content = parsed.content
    if spec.tool_choice_required and content is None:
        content = ""  # vLLM's "required" path always says content ""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if parsed.tool_calls:
        message["tool_calls"] = [
            {"id": spec.tool_call_ids[i], "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for i, c in enumerate(parsed.tool_calls)
        ]
    message[spec.reasoning_field] = parsed.reasoning
    logprobs = None
    if spec.want_logprobs:
        entries = [logprob_entry(tokenizer, spec, i) for i in range(len(ids))]
        if spec.logprob_mismatch and entries:
            entries.pop()
        logprobs = {"content": entries}
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": _finish_reason(spec, parsed, streamed=False),
        "stop_reason": None,
        "token_ids": ids if spec.return_token_ids else None,
        "routed_experts": None,
    }
    if spec.weight_versions_key:
        choice["weight_versions"] = None if spec.weight_versions is None else (
            [{"version": spec.weight_versions, "start": 0, "end": len(ids)}] if ids else [])
    body: dict[str, Any] = {
        "id": spec.request_id,
        "object": "chat.completion",
        "created": spec.created,
        "model": spec.model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": spec.system_fingerprint,
        "usage": {**usage(spec, len(ids)), "prompt_tokens_details": None, "completion_tokens_details": None},
        "prompt_logprobs": None,
        "prompt_token_ids": spec.prompt_ids if spec.return_token_ids else None,
        "prompt_text": spec.prompt_text,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }
    if spec.missing_token_ids:
        del choice["token_ids"], body["prompt_token_ids"]
    return body


class StreamEncoder:
    """Builds the SSE chunks of one streamed reply, token by token.

    The deltas come from the parse of the whole sampled text (see ``deltas``). A stream cut short
    by an abort keeps the deltas it already sent; the non-streamed reply of an aborted request is
    parsed from its partial text instead.
    """

    def __init__(self, tokenizer: ReferenceTokenizer, spec: ReplySpec) -> None:
        self.tokenizer = tokenizer
        self.spec = spec
        text = output_text(tokenizer, spec.token_ids)
        self.parsed = parse_reply(spec, text)
        _ensure_tool_call_ids(spec, self.parsed)
        self._deltas = token_deltas(tokenizer, spec.token_ids, text, self.parsed, spec.tool_call_ids,
                                    spec.reasoning_field, spec.tool_parser)

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        spec = self.spec
        chunk = {"id": spec.request_id, "object": "chat.completion.chunk", "created": spec.created,
                 "model": spec.model, "choices": choices, **extra}
        return b"data: " + dumps(chunk) + b"\n\n"

    def first(self) -> bytes:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        if self.spec.missing_token_ids:
            return self._chunk([choice], prompt_text=self.spec.prompt_text)
        prompt_ids = self.spec.prompt_ids if self.spec.return_token_ids else None
        return self._chunk([choice], prompt_token_ids=prompt_ids, prompt_text=self.spec.prompt_text)

    def token(self, position: int, finish_reason: str | None = None) -> bytes:
        """The chunk of sampled token ``position``; the last one (or an aborted one) carries the finish."""
        spec = self.spec
        choice: dict[str, Any] = {"index": 0, "delta": self._deltas[position], "logprobs": None,
                                  "finish_reason": None}
        if spec.want_logprobs:
            skip = spec.logprob_mismatch and position == len(spec.token_ids) - 1
            entries = [] if skip else [logprob_entry(self.tokenizer, spec, position)]
            choice["logprobs"] = {"content": entries}
        if finish_reason is None and position == len(spec.token_ids) - 1:
            finish_reason = _finish_reason(spec, self.parsed, streamed=True)
        extra: dict[str, Any] = {}
        if finish_reason is not None:
            choice["finish_reason"] = finish_reason
            choice["stop_reason"] = None
            if not spec.include_usage:
                extra["system_fingerprint"] = spec.system_fingerprint
        if not spec.missing_token_ids:
            choice["token_ids"] = [spec.token_ids[position]] if spec.return_token_ids else None
        return self._chunk([choice], **extra)

    def closing(self, finish_reason: str) -> bytes:
        """A finish chunk without a new token (a completion of no tokens)."""
        choice: dict[str, Any] = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason,
                                  "stop_reason": None}
        if not self.spec.missing_token_ids:
            choice["token_ids"] = [] if self.spec.return_token_ids else None
        extra = {} if self.spec.include_usage else {"system_fingerprint": self.spec.system_fingerprint}
        return self._chunk([choice], **extra)

    def usage(self, emitted: int) -> bytes:
        return self._chunk([], usage=usage(self.spec, emitted), system_fingerprint=self.spec.system_fingerprint)

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"
