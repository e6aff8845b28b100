"""SGLang 0.5.23's wire shapes for the reference engine's SGLang flavour: bodies only, no I/O.

Why a module of its own: the SGLang flavour must answer with exactly the keys SGLang's own code writes
(``tests/testing/engine/test_sglang_flavour.py`` holds every body to SGLang's classes), so each shape is
decided here, each after the SGLang code that builds it:

- ``meta_info`` of a finished request (``TokenizerManager._handle_batch_output``): ``id``,
  ``finish_reason`` (``FINISH_*.to_json``: ``{type: stop, matched}``, ``{type: length, length}``,
  ``{type: abort, message, status_code, err_type}``), ``prompt_tokens``, ``weight_version``,
  ``num_retractions``; with ``return_logprob`` ``input_token_logprobs``, ``output_token_logprobs``
  (``[logprob, id, text]`` triples, the text null unless ``return_text_in_logprobs``, which the chat
  route sets) and ``output_token_logprobs_length`` (and the top-logprob lists with ``top_logprobs_num``);
  ``reasoning_tokens``, ``completion_tokens``, ``cached_tokens``, ``weight_versions`` spans
  (``weight_versions.py``) and ``e2e_latency``;
- ``/generate``: ``{text, output_ids, meta_info}`` (plus ``prompt_token_ids`` on request);
- ``/v1/chat/completions`` (``OpenAIServingChat._build_chat_response``): per choice ``prompt_token_ids``
  (``return_prompt_token_ids`` or ``return_token_ids``), ``response_token_ids`` (``return_token_ids``),
  ``meta_info`` (``return_meta_info``), ``matched_stop``; a tool-call reply turns the finish reason
  (the same dict as ``meta_info``'s) into ``{type: tool_calls, matched: null}``; top-level ``metadata``
  (``build_endpoint_weight_version_metadata``: ``weight_version`` and its spans).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from openenv_harness.testing.engine.parser import ParsedOutput
from openenv_harness.testing.engine.policy import token_logprob
from openenv_harness.testing.engine.tokenizer import ReferenceTokenizer

#: ``serving_chat``'s tool-call id (every parser but the Kimi ones): ``call_`` and 24 hex digits
def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class Generation:
    """One request's sampled output as SGLang reports it (filled in as tokens are emitted)."""

    rid: str
    key: str
    turn_index: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    #: scripted end of the sample: "stop" (natural, on the end-of-turn id) or "length"
    finish: str
    started: float
    emitted: int = 0
    aborted: bool = False
    retractions: int = 0
    #: (version, tokens emitted under it) each time the served weights changed mid-request
    version_events: list[tuple[str, int]] = field(default_factory=list)
    #: the reported logprobs over the scripted ones (``policy.logprob_scale``): the alternatives scale alike
    scale: float = 1.0

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[: self.emitted]


def finish_reason(gen: Generation, eos_id: int) -> dict[str, Any]:
    """``FINISH_*.to_json`` for the way ``gen`` ended."""
    if gen.aborted:
        return {"type": "abort", "message": None, "status_code": None, "err_type": None}
    if gen.finish == "stop" and gen.output_ids and gen.output_ids[-1] == eos_id:
        return {"type": "stop", "matched": eos_id}
    return {"type": "length", "length": gen.emitted}


def weight_spans(gen: Generation, current: str) -> list[dict[str, Any]]:
    """``compute_weight_version_spans`` then ``add_weight_versions_to_meta_info``: contiguous spans of
    output positions per weight version, the current version's last."""
    spans: list[dict[str, Any]] = []
    for version, end in [*gen.version_events, (current, gen.emitted)]:
        end = min(end, gen.emitted)
        if spans and end <= spans[-1]["end"]:
            continue
        if spans and version == spans[-1]["version"]:
            spans[-1]["end"] = end
            continue
        spans.append({"version": version, "start": spans[-1]["end"] if spans else 0, "end": end})
    return [s for s in spans if s["start"] < gen.emitted or s["start"] == 0]


def _alternatives(tokenizer: ReferenceTokenizer, gen: Generation, position: int, count: int,
                  text: bool) -> list[list[Any]]:
    """``count`` top candidates at ``position``: the sampled token, then deterministic lower ones."""
    sampled = gen.token_ids[position]
    out: list[list[Any]] = [[gen.logprobs[position], sampled, tokenizer.token_texts[sampled] if text else None]]
    step = 1
    while len(out) < count:
        other = (sampled + step * 977) % tokenizer.vocab_size
        step += 1
        if other == sampled:
            continue
        scripted = gen.logprobs[position] / gen.scale
        value = (min(token_logprob(gen.key, gen.turn_index, position, other), scripted) - 0.25) * gen.scale
        out.append([value, other, tokenizer.token_texts[other] if text else None])
    return out


def meta_info(tokenizer: ReferenceTokenizer, gen: Generation, *, weight_version: str, now: float,
              return_logprob: bool, top_logprobs_num: int = 0, logprob_start_len: int = -1,
              text_in_logprobs: bool = False) -> dict[str, Any]:
    """A finished request's ``meta_info``, keys in SGLang's order."""
    meta: dict[str, Any] = {"id": gen.rid, "finish_reason": finish_reason(gen, tokenizer.im_end_id),
                            "prompt_tokens": len(gen.prompt_ids), "weight_version": weight_version,
                            "num_retractions": gen.retractions}
    if return_logprob:
        def entry(value: float | None, token: int) -> list[Any]:
            return [value, token, tokenizer.token_texts[token] if text_in_logprobs else None]

        start = len(gen.prompt_ids) if logprob_start_len < 0 else min(logprob_start_len, len(gen.prompt_ids))
        meta["input_token_logprobs"] = [
            entry(None if p == 0 else token_logprob("prompt", 0, p, t), t)
            for p, t in enumerate(gen.prompt_ids) if p >= start]
        meta["output_token_logprobs"] = [entry(gen.logprobs[p], t) for p, t in enumerate(gen.output_ids)]
        meta["output_token_logprobs_length"] = gen.emitted
        if top_logprobs_num > 0:
            meta["input_top_logprobs"] = [None if p == 0 else [] for p in range(start, len(gen.prompt_ids))]
            meta["output_top_logprobs"] = [_alternatives(tokenizer, gen, p, top_logprobs_num, text_in_logprobs)
                                           for p in range(gen.emitted)]
    spans = weight_spans(gen, weight_version)
    meta.update(reasoning_tokens=0, completion_tokens=gen.emitted, cached_tokens=0)
    meta["weight_versions"] = spans
    meta["weight_version"] = spans[-1]["version"]
    meta["e2e_latency"] = max(now - gen.started, 0.0)
    return meta


def generate_body(text: str, gen: Generation, meta: dict[str, Any], prompt_token_ids: bool) -> dict[str, Any]:
    """``/generate``'s reply for one prompt (``out_dict`` of a finished, non-streamed request)."""
    body: dict[str, Any] = {"text": text, "output_ids": list(gen.output_ids), "meta_info": meta}
    if prompt_token_ids:
        body["prompt_token_ids"] = list(gen.prompt_ids)
    return body


def chat_logprobs(tokenizer: ReferenceTokenizer, meta: dict[str, Any]) -> dict[str, Any]:
    """``_process_response_logprobs``: one entry per output triple, bytes from the token id (byte-level BPE)."""
    tops = meta.get("output_top_logprobs") or [[] for _ in meta["output_token_logprobs"]]
    content = []
    for (value, token, text), top in zip(meta["output_token_logprobs"], tops):
        content.append({"token": text, "bytes": list(tokenizer.token_bytes[token]), "logprob": value,
                        "top_logprobs": [{"token": t, "bytes": list(tokenizer.token_bytes[i]), "logprob": v}
                                         for v, i, t in top]})
    return {"content": content}


@dataclass(frozen=True)
class ChatOptions:
    """What a chat request asked to see."""

    model: str
    return_prompt_token_ids: bool
    return_token_ids: bool
    return_meta_info: bool
    logprobs: bool


def chat_body(tokenizer: ReferenceTokenizer, gen: Generation, meta: dict[str, Any], parsed: ParsedOutput,
              options: ChatOptions, created: int) -> dict[str, Any]:
    """``_build_chat_response`` for one choice."""
    finish = meta["finish_reason"]  # the same dict: a tool-call reply rewrites meta_info's too
    tool_calls = None
    if parsed.tool_calls:
        tool_calls = [{"id": tool_call_id(), "index": i, "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}} for i, c in enumerate(parsed.tool_calls)]
        if finish["type"] == "stop":
            finish["type"], finish["matched"] = "tool_calls", None
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content or "",
                               "reasoning_content": parsed.reasoning or None}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    choice: dict[str, Any] = {"index": 0, "message": message,
                              "logprobs": chat_logprobs(tokenizer, meta) if options.logprobs else None,
                              "finish_reason": finish["type"], "matched_stop": finish.get("matched")}
    if options.return_prompt_token_ids or options.return_token_ids:
        choice["prompt_token_ids"] = list(gen.prompt_ids)
    if options.return_token_ids:
        choice["response_token_ids"] = list(gen.output_ids)
    if options.return_meta_info:
        choice["meta_info"] = meta
    usage = {"prompt_tokens": len(gen.prompt_ids), "total_tokens": len(gen.prompt_ids) + gen.emitted,
             "completion_tokens": gen.emitted, "prompt_tokens_details": None, "reasoning_tokens": 0,
             "completion_tokens_details": None}
    metadata: dict[str, Any] = {"weight_version": meta["weight_version"], "weight_versions": meta["weight_versions"]}
    return {"id": gen.rid, "object": "chat.completion", "created": created, "model": options.model,
            "choices": [choice], "usage": usage, "metadata": metadata}


def tool_call_items(parsed: ParsedOutput, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``ToolCallItem.model_dump()`` per parsed call: ``tool_index`` is the tool's place in the request."""
    names = [((t.get("function") or {}).get("name") if isinstance(t, dict) else None) for t in tools]
    return [{"tool_index": names.index(c.name) if c.name in names else -1, "name": c.name,
             "parameters": c.arguments} for c in parsed.tool_calls]


def error_body(message: str, status: int = 400, err_type: str = "BadRequestError") -> dict[str, Any]:
    """``ErrorResponse.model_dump()``: SGLang's error shape on its OpenAI routes."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}
