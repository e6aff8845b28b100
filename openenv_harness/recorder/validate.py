"""Read the token evidence out of an engine reply, and check it, without a per-token Python loop.

Why it is written this way: prompts are thousands of ids long and arrive on every call. Converting
them to ``array('I')`` is a single C-level pass that also rejects floats, strings, negatives and
values beyond uint32 -- exactly the checks "ids are non-negative ints" needs. Logprobs go to
``array('d')``; finiteness is checked on their sum and the upper bound on their max.

A reply whose evidence fails is still recorded (as untrainable, with the reasons): nothing is
silently dropped and nothing doubtful reaches a trainer as trainable (D15).
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TOKEN_ID_PREFIX = "token_id:"


@dataclass
class Evidence:
    """The tokens of one reply and whether they can be trained on."""

    prompt_ids: array[int] | None = None
    completion_ids: array[int] | None = None
    logprobs: array[float] | None = None
    completion_tokens: list[str] | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    reasons: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.reasons


def _ids(values: Any, what: str, reasons: list[str]) -> array[int] | None:
    if values is None:
        return None
    if not isinstance(values, list):
        reasons.append(f"{what} is not a list")
        return None
    try:
        out = array("I", values)
    except (TypeError, OverflowError):
        reasons.append(f"{what} contains a value that is not a non-negative integer id")
        return None
    # JSON true/false pass as 1/0 (bool is an int to Python); only a list holding a 0 or a 1 can
    # hold one, and only then is each value's type looked at
    if out and int(np.frombuffer(out, dtype=np.uintc).min()) <= 1 and bool in set(map(type, values)):
        reasons.append(f"{what} contains a value that is not a non-negative integer id")
        return None
    return out


def _ids_from_tokens(tokens: list[str]) -> array[int] | None:
    """Recover ids from vLLM's ``--return-tokens-as-token-ids`` strings; None if any is not one."""
    out = array("I")
    plen = len(TOKEN_ID_PREFIX)
    for tok in tokens:
        if not tok.startswith(TOKEN_ID_PREFIX):
            return None
        digits = tok[plen:]
        # exactly what vLLM writes ("token_id:%d"): not " 7", "+7", "07", "7_0" or other scripts' digits
        if not (digits.isascii() and digits.isdigit()) or (digits[0] == "0" and len(digits) > 1):
            return None
        try:
            out.append(int(digits))
        except OverflowError:
            return None
    return out


def extract_evidence(reply: dict[str, Any], prompt_ids: array[int] | None = None) -> Evidence:
    """Pull prompt ids, sampled ids and logprobs from a vLLM-shaped chat reply and check them.

    ``prompt_ids``: the reply's prompt ids when the transport already read them into an array.
    """
    ev = Evidence()
    reasons = ev.reasons
    choices = reply.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        reasons.append("reply must have exactly one choice")
        return ev
    choice = choices[0]
    ev.finish_reason = choice.get("finish_reason")
    usage = reply.get("usage")
    ev.usage = usage if isinstance(usage, dict) else None

    ev.prompt_ids = prompt_ids if prompt_ids is not None else _ids(reply.get("prompt_token_ids"), "prompt_token_ids", reasons)
    if ev.prompt_ids is None and reply.get("prompt_token_ids") is None:  # absent, or null
        reasons.append("engine returned no prompt_token_ids")
    elif ev.prompt_ids is not None and len(ev.prompt_ids) == 0:
        reasons.append("prompt_token_ids is empty")

    content: Any = None  # logprobs.content as the engine sent it
    lp = choice.get("logprobs")
    if isinstance(lp, dict):
        content = lp.get("content")
    if isinstance(content, list):
        try:
            ev.logprobs = array("d", [entry["logprob"] for entry in content])
        except (TypeError, KeyError):
            reasons.append("logprobs.content entries lack a numeric logprob")
    else:
        reasons.append("engine returned no logprobs")

    ev.completion_ids = _ids(choice.get("token_ids"), "choices[0].token_ids", reasons)
    if ev.completion_ids is None:
        # no usable ids: the sampled tokens' strings are kept as evidence (and give the ids when
        # they are "token_id:N"); read only here -- with ids they would be one more pass per token
        if isinstance(content, list):
            tokens = [entry.get("token") for entry in content if isinstance(entry, dict)]
            if len(tokens) == len(content) and all(isinstance(t, str) for t in tokens):
                ev.completion_tokens = tokens  # type: ignore[assignment]
        if choice.get("token_ids") is None:  # absent, or null: the strings are all there is
            if ev.completion_tokens is not None:
                ev.completion_ids = _ids_from_tokens(ev.completion_tokens)
            if ev.completion_ids is None:
                reasons.append("engine returned no completion token ids")

    if ev.logprobs is not None and len(ev.logprobs):
        total = math.fsum(ev.logprobs)
        top = max(ev.logprobs)
        if not math.isfinite(total):
            reasons.append("a logprob is not finite")
        elif top > 0.0:
            reasons.append("a logprob is positive")
        elif top == 0.0 and any(type(entry["logprob"]) is bool for entry in content):  # false reads as 0.0
            reasons.append("logprobs.content entries lack a numeric logprob")
    if ev.completion_ids is not None and ev.logprobs is not None and len(ev.completion_ids) != len(ev.logprobs):
        reasons.append(f"{len(ev.completion_ids)} sampled ids but {len(ev.logprobs)} logprobs")
    if ev.usage is not None:
        pt, ct = ev.usage.get("prompt_tokens"), ev.usage.get("completion_tokens")
        if ev.prompt_ids is not None and isinstance(pt, int) and pt != len(ev.prompt_ids):
            reasons.append(f"usage.prompt_tokens={pt} but {len(ev.prompt_ids)} prompt ids")
        if ev.completion_ids is not None and isinstance(ct, int) and ct != len(ev.completion_ids):
            reasons.append(f"usage.completion_tokens={ct} but {len(ev.completion_ids)} sampled ids")
    return ev


#: What a plain OpenAI server sends in a chat completion: the agent sees these and nothing else.
#: A rule, not a list of vLLM's extras: every field an engine adds (``prompt_token_ids``,
#: ``prompt_text``, ``kv_transfer_params``, ``metrics``, ``routed_experts``, ``stop_reason``, a
#: future ``*_token_ids``...) is evidence for the record, never part of the agent's reply.
_AGENT_TOP = frozenset({"id", "object", "created", "model", "choices", "usage", "system_fingerprint", "service_tier"})
_AGENT_CHOICE = frozenset({"index", "message", "logprobs", "finish_reason"})
#: the message as OpenAI sends it, plus the reasoning fields engines add and agents read back
_AGENT_MESSAGE = frozenset({"role", "content", "refusal", "tool_calls", "function_call", "annotations", "audio",
                            "reasoning", "reasoning_content"})
_AGENT_TOOL_CALL = frozenset({"id", "type", "index", "function"})
_AGENT_FUNCTION = frozenset({"name", "arguments"})
_AGENT_USAGE = frozenset({"prompt_tokens", "completion_tokens", "total_tokens"})
_AGENT_LOGPROB = frozenset({"token", "logprob", "bytes", "top_logprobs"})


def _only(value: Any, keys: frozenset[str]) -> Any:
    return {k: v for k, v in value.items() if k in keys} if isinstance(value, dict) else value


def _message_view(message: Any) -> Any:
    if not isinstance(message, dict):
        return message
    out = _only(message, _AGENT_MESSAGE)
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        views = []
        for call in calls:
            view = _only(call, _AGENT_TOOL_CALL)
            if isinstance(view, dict) and isinstance(view.get("function"), dict):
                view["function"] = _only(view["function"], _AGENT_FUNCTION)
            views.append(view)
        out["tool_calls"] = views
    return out


def _logprobs_view(logprobs: Any) -> Any:
    if not isinstance(logprobs, dict):
        return logprobs
    out = {k: v for k, v in logprobs.items() if k in ("content", "refusal")}
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = [_only(entry, _AGENT_LOGPROB) for entry in content]
    return out


def agent_view(reply: dict[str, Any], *, keep_logprobs: bool) -> dict[str, Any]:
    """The engine's reply as a plain OpenAI server would send it (new dicts; the input is untouched).

    Also what is stored as the record's ``response``: the engine's extras are evidence, kept in the
    record's own fields (ids, logprobs, metadata), not in the reply a trainer may replay.
    """
    out: dict[str, Any] = _only(reply, _AGENT_TOP)  # reply is a dict: so is its view
    choices = []
    for choice in reply.get("choices") or []:
        if not isinstance(choice, dict):
            choices.append(choice)
            continue
        c = _only(choice, _AGENT_CHOICE)
        if "message" in c:
            c["message"] = _message_view(c["message"])
        if not keep_logprobs:
            c.pop("logprobs", None)
        elif "logprobs" in c:
            c["logprobs"] = _logprobs_view(c["logprobs"])
        choices.append(c)
    out["choices"] = choices
    if "usage" in out:
        out["usage"] = _only(out["usage"], _AGENT_USAGE)
    return out
