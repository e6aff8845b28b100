"""A session's training sampling policy: what the engine must sample from for the records to train.

A trainer's importance ratio compares its own logprobs with the engine's; it can only reproduce
the distribution the engine sampled from when that distribution is the model's whole vocabulary at a
known temperature. Agents send narrowing knobs of their own (top-p, top-k, penalties, logit biases)
and engines fill in defaults from the model's generation config, so a session that trains pins a
policy (``SessionSpec.training_sampling``): every call is sent with the policy's values, a narrowing
knob the agent sent is *neutralised* (replaced by its neutral value and recorded with what the agent
asked), and a call whose effective sampling still differs from the policy -- or whose engine's
logprobs are not of the sampled distribution at the policy's temperature -- is recorded with the
difference and is not trainable. Nothing is silently trained on another policy's logprobs.
"""

from __future__ import annotations

import math
from typing import Any

#: The knobs a policy fixes (at their neutral value, temperature at the policy's)
NEUTRAL_KNOBS: dict[str, Any] = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                                 "presence_penalty": 0.0, "frequency_penalty": 0.0}
#: Request fields that narrow or bias the distribution token by token; under a policy they are dropped
BIASING_FIELDS = ("logit_bias", "allowed_token_ids", "bad_words")
#: top_k values that leave the vocabulary whole (vLLM reads both as off)
_TOP_K_OFF = (-1, 0)


def policy_values(temperature: float) -> dict[str, Any]:
    """The sampling fields a policy sends on every call."""
    return {"temperature": float(temperature), **NEUTRAL_KNOBS}


def apply_policy(out: dict[str, Any], agent_body: dict[str, Any], temperature: float) -> dict[str, Any]:
    """Set the policy's values on the upstream body ``out``; return what the agent had asked that the
    policy changed (field -> the agent's value), for the record."""
    neutralised: dict[str, Any] = {}
    for name, value in policy_values(temperature).items():
        if name in agent_body and not same_value(name, agent_body[name], value):
            neutralised[name] = agent_body[name]
        out[name] = value
    for name in BIASING_FIELDS:
        if agent_body.get(name) is not None:
            neutralised[name] = agent_body[name]
        out.pop(name, None)
    return neutralised


def same_value(name: str, a: Any, b: Any) -> bool:
    if name == "top_k":
        return (a in _TOP_K_OFF and b in _TOP_K_OFF) or a == b
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    except (TypeError, ValueError):
        return bool(a == b)


def policy_differences(effective: dict[str, Any], unknown: list[str], logprobs_mode: str,
                       temperature: float) -> dict[str, Any]:
    """How a call's effective sampling differs from the policy (empty: it is the policy's).

    Also a difference: logprobs that are not of the sampled distribution -- raw logprobs (before
    temperature) at a temperature other than 1, or an unmeasured mode there."""
    out: dict[str, Any] = {}
    for name, value in policy_values(temperature).items():
        if name in unknown:
            out[name] = {"policy": value, "effective": "unknown"}
        elif name in effective and not same_value(name, effective[name], value):
            out[name] = {"policy": value, "effective": effective[name]}
    if not math.isclose(temperature, 1.0) and logprobs_mode != "processed_logprobs":
        out["logprobs_mode"] = {"policy": "processed_logprobs", "effective": logprobs_mode}
    return out


def refusal(temperature: float, logprobs_mode: str) -> str | None:
    """Why a session cannot train at ``temperature`` on an engine whose logprobs are ``logprobs_mode``."""
    if math.isclose(temperature, 1.0) or logprobs_mode != "raw_logprobs":
        return None
    return (f"training_sampling at temperature {temperature:g} needs the sampled distribution's logprobs, and the "
            "engine's are raw (measured: before temperature): start vLLM with --logprobs-mode processed_logprobs "
            "(trl vllm-serve does), or train at temperature 1")
