"""What the viewer page needs of one recorded call, without shipping whole token arrays.

Why a digest and not the raw record: a long agent session holds tens of thousands of prompt ids
per call, repeated in every call. A browser that receives (and lays out) all of them freezes. The
page shows what explains a call -- the last few messages, the reply, the sampled ids with their
mask, and the prompt ids near the end and near the divergence point -- and fetches any other span
on demand (``token_slice``). Nothing here decodes ids: the recorder has no tokenizer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

#: How many of the request's last messages a digest carries.
DEFAULT_MESSAGES = 4
#: Prompt ids shown at the end of the prompt, and before the divergence point.
DEFAULT_TAIL = 128
DEFAULT_AROUND = 32
#: Sampled ids a digest carries; longer completions are expanded on demand.
DEFAULT_COMPLETION = 1024
#: The most ids one slice request may return.
MAX_SLICE = 8192
#: Message text beyond this many characters is cut (the full request stays in the record).
MAX_TEXT = 4000

TokenPart = Literal["prompt", "completion"]


class DigestOptions(BaseModel):
    """How much of each call a digest carries."""

    messages: int = Field(DEFAULT_MESSAGES, ge=0, le=64)
    tail: int = Field(DEFAULT_TAIL, ge=0, le=MAX_SLICE)
    around: int = Field(DEFAULT_AROUND, ge=0, le=MAX_SLICE)
    completion: int = Field(DEFAULT_COMPLETION, ge=0, le=MAX_SLICE)


def _text(value: Any) -> tuple[str, bool]:
    """Message content as display text (content parts joined), and whether it was cut."""
    if value is None:
        return "", False
    if isinstance(value, list):
        pieces = []
        for part in value:
            if isinstance(part, Mapping):
                text = part.get("text")
                pieces.append(text if isinstance(text, str) else f"[{part.get('type', 'part')}]")
            else:
                pieces.append(str(part))
        value = "".join(pieces)
    elif not isinstance(value, str):
        value = str(value)
    if len(value) > MAX_TEXT:
        return value[:MAX_TEXT], True
    return value, False


def message_view(message: Any) -> dict[str, Any]:
    """One chat message reduced to role, text, reasoning and tool calls (arguments verbatim)."""
    if not isinstance(message, Mapping):
        return {"role": "?", "content": str(message)[:MAX_TEXT], "truncated": False, "tool_calls": []}
    content, cut = _text(message.get("content"))
    reasoning, cut_r = _text(message.get("reasoning_content") or message.get("reasoning"))
    calls = []
    for call in message.get("tool_calls") or []:
        if not isinstance(call, Mapping):
            continue
        fn = call.get("function") or {}
        arguments, cut_a = _text(fn.get("arguments") if isinstance(fn, Mapping) else None)
        calls.append({"id": call.get("id"), "name": fn.get("name") if isinstance(fn, Mapping) else None,
                      "arguments": arguments, "truncated": cut_a})
    view: dict[str, Any] = {"role": str(message.get("role", "?")), "content": content,
                            "truncated": cut or cut_r, "tool_calls": calls}
    if reasoning:
        view["reasoning"] = reasoning
    if message.get("tool_call_id"):
        view["tool_call_id"] = message.get("tool_call_id")
    return view


def response_message(response: Mapping[str, Any]) -> dict[str, Any] | None:
    """The engine's reply message (first choice), if the call produced one."""
    choices = response.get("choices") if isinstance(response, Mapping) else None
    if not choices or not isinstance(choices[0], Mapping):
        return None
    message = choices[0].get("message")
    return message_view(message) if message is not None else None


def logprob_stats(logps: Sequence[Any]) -> dict[str, Any]:
    """Rollout logprob summary of one call (the recorder holds no trainer logprobs to compare)."""
    finite = [float(x) for x in logps if isinstance(x, (int, float)) and math.isfinite(x)]
    if not finite:
        return {"count": len(logps), "finite": 0, "mean": None, "min": None}
    return {"count": len(logps), "finite": len(finite), "mean": math.fsum(finite) / len(finite), "min": min(finite)}


def prompt_windows(length: int, divergence_at: int | None, *, tail: int, around: int) -> list[tuple[int, int]]:
    """Half-open ``[start, stop)`` spans of the prompt a digest shows: the end, and the divergence.

    The divergence window runs from ``around`` ids before the divergence point to ``around`` ids
    after it; overlapping or touching spans are merged, so the page never repeats an id.
    """
    spans: list[tuple[int, int]] = []
    if length <= 0:
        return spans
    if tail > 0:
        spans.append((max(0, length - tail), length))
    if divergence_at is not None and 0 <= divergence_at <= length:
        start = max(0, divergence_at - around)
        stop = min(length, divergence_at + max(around, 1))
        if stop > start:
            spans.append((start, stop))
    spans.sort()
    merged: list[tuple[int, int]] = []
    for start, stop in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def _fidelity(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    fidelity = metadata.get("fidelity")
    if not isinstance(fidelity, Mapping):
        return None
    return {
        "class": fidelity.get("class"),
        "parent": fidelity.get("parent"),
        "divergence_at": fidelity.get("divergence_at"),
        "drift_tokens": fidelity.get("drift_tokens", 0),
        **({"cause": fidelity["cause"]} if "cause" in fidelity else {}),  # drift and break only
    }


def _completion_mask(entry: Mapping[str, Any], n_prompt: int, n_completion: int, stop: int) -> list[int]:
    """The record's own loss mask over the shown sampled ids (0 where the mask is missing)."""
    mask = entry.get("loss_mask") or []
    if len(mask) != n_prompt + n_completion:
        return [0] * min(stop, n_completion)
    return [1 if mask[n_prompt + i] else 0 for i in range(min(stop, n_completion))]


def call_digest(entry: Mapping[str, Any], options: DigestOptions | None = None) -> dict[str, Any]:
    """Everything the page shows for one call; token arrays cut to the windows described above."""
    opts = options or DigestOptions()
    md: Mapping[str, Any] = entry.get("metadata") or {}
    prompt: Sequence[int] = entry.get("prompt_token_ids") or []
    completion: Sequence[int] = entry.get("completion_token_ids") or []
    strings: Sequence[str] | None = entry.get("completion_tokens")
    logps: Sequence[float] = entry.get("per_token_logps") or []
    mask: Sequence[int] = entry.get("loss_mask") or []
    fidelity = _fidelity(md)
    divergence = fidelity.get("divergence_at") if fidelity else None
    request = entry.get("request") or {}
    messages = request.get("messages") if isinstance(request, Mapping) else None
    messages = messages if isinstance(messages, list) else []
    shown = messages[-opts.messages:] if opts.messages else []
    n_completion = len(completion) if completion else len(strings or [])
    shown_completion = min(n_completion, opts.completion)
    return {
        "node_id": md.get("node_id"),
        "call_index": md.get("call_index"),
        "seq": md.get("seq"),
        "call_kind": md.get("call_kind", "agent"),
        "aux_rule": md.get("aux_rule"),
        "status": md.get("status", "ok"),
        "trainable": bool(md.get("trainable", True)),
        "invalid_reasons": list(md.get("invalid_reasons") or []),
        "error": md.get("error"),
        "finish_reason": md.get("finish_reason"),
        "stream": bool(md.get("stream", False)),
        "policy_version_start": md.get("policy_version_start", 0),
        "policy_version_end": md.get("policy_version_end", 0),
        "straddled_sync": bool(md.get("straddled_sync", False)),
        "limits": md.get("limits") or {},
        "received_at": md.get("received_at"),
        "upstream_ms": md.get("upstream_ms"),
        "model": (md.get("provenance") or {}).get("model"),
        "fidelity": fidelity,
        "messages_total": len(messages),
        "messages": [message_view(m) for m in shown],
        "response": response_message(entry.get("response") or {}),
        "prompt_len": len(prompt),
        "prompt_windows": [
            {"start": start, "ids": list(prompt[start:stop])}
            for start, stop in prompt_windows(len(prompt), divergence, tail=opts.tail, around=opts.around)
        ],
        "prompt_mask_nonzero": sum(1 for m in mask[: len(prompt)] if m),
        "completion_len": n_completion,
        "completion_ids": list(completion[:shown_completion]),
        "completion_tokens": list(strings[:shown_completion]) if strings else None,
        "completion_logps": [float(x) for x in logps[:shown_completion]],
        "completion_mask": _completion_mask(entry, len(prompt), n_completion, shown_completion),
        "logprobs": logprob_stats(logps),
    }


def token_slice(entry: Mapping[str, Any], part: TokenPart, start: int, stop: int) -> dict[str, Any]:
    """Ids ``[start, stop)`` of a call's prompt or completion (clamped), for the page's expanders.

    Raises ``ValueError`` for an empty or oversized span: the caller answers 422.
    """
    if start < 0 or stop <= start:
        raise ValueError(f"need 0 <= start < stop, got start={start} stop={stop}")
    if stop - start > MAX_SLICE:
        raise ValueError(f"at most {MAX_SLICE} ids per slice, asked for {stop - start}")
    if part == "prompt":
        ids: Sequence[int] = entry.get("prompt_token_ids") or []
        return {"part": part, "start": start, "length": len(ids), "ids": list(ids[start:stop])}
    completion: Sequence[int] = entry.get("completion_token_ids") or []
    strings: Sequence[str] | None = entry.get("completion_tokens")
    n = len(completion) if completion else len(strings or [])
    prompt_len = len(entry.get("prompt_token_ids") or [])
    logps = entry.get("per_token_logps") or []
    return {
        "part": part,
        "start": start,
        "length": n,
        "ids": list(completion[start:stop]),
        "tokens": list(strings[start:stop]) if strings else None,
        "logps": [float(x) for x in logps[start:stop]],
        "mask": _completion_mask(entry, prompt_len, n, n)[start:stop],
    }
