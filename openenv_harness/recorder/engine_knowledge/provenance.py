"""What the recorder learns about the engine for provenance (D11), and the served-template
fingerprint (D3's residual duty). The per-call provenance a record carries is ``call/pending.py: call_provenance``.

The recorder cannot read the engine's chat template -- it has no tokenizer and renders nothing --
but it can *probe* it: fixed probe conversations sent through the engine's ``/tokenize`` come back
as ids, and the hash of those ids fingerprints the template actually served (text, kwargs and
tokenizer together). A trainer declares the fingerprint it trains with (computed by
``openenv_harness.trainer.template`` from its own tokenizer); a mismatch fails session creation.
Engines without ``/tokenize`` get ``template_status: "unverified"`` -- never a silent pass.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from openenv_harness.recorder.upstream.routes import RENDER, TOKENIZE

if TYPE_CHECKING:
    from openenv_harness.recorder.upstream.base import Upstream

SAMPLING_FIELDS = (
    "model", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "max_tokens", "max_completion_tokens", "seed", "stop", "stop_token_ids",
    "logprobs", "top_logprobs", "return_token_ids", "chat_template_kwargs", "reasoning_effort",
    "tool_choice", "parallel_tool_calls", "n", "ignore_eos", "skip_special_tokens",
)

#: The probe conversations. Changing them changes every fingerprint: they are versioned.
PROBE_VERSION = 1
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
]
PROBES: list[dict[str, Any]] = [
    {
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "List the files."},
        ],
        "tools": _PROBE_TOOLS,
        "add_generation_prompt": True,
    },
    {
        "messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "List the files."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "call_probe_1", "type": "function",
                     "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_probe_1", "content": "a.py\nb.py\n"},
        ],
        "tools": _PROBE_TOOLS,
        "add_generation_prompt": True,
    },
    {
        "messages": [
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi."},
            {"role": "user", "content": "Again."},
        ],
        "add_generation_prompt": True,
    },
]


def fingerprint_ids(id_lists: list[list[int]]) -> str:
    """The fingerprint of a template: sha256 over the probe ids (and the probe version)."""
    payload = json.dumps({"probe_version": PROBE_VERSION, "ids": id_lists}, separators=(",", ":"))
    return "tpl1-" + hashlib.sha256(payload.encode()).hexdigest()


async def probe_template(upstream: Upstream, model: str | None = None) -> tuple[str | None, str]:
    """``(fingerprint, "probed")`` from the engine's ``/tokenize``, or ``(None, reason)``."""
    from openenv_harness.recorder.upstream.base import UpstreamFailure

    id_lists: list[list[int]] = []
    for probe in PROBES:
        body: dict[str, Any] = {"messages": probe["messages"], "add_generation_prompt": probe["add_generation_prompt"]}
        if probe.get("tools"):
            body["tools"] = probe["tools"]
        if model:
            body["model"] = model
        try:
            reply = await upstream.request("POST", TOKENIZE, json=body)
        except UpstreamFailure as exc:
            return None, f"unverified: /tokenize unreachable ({exc.kind})"
        tokens = (reply.json or {}).get("tokens")
        if reply.status != 200 or not isinstance(tokens, list):
            return None, f"unverified: engine has no usable /tokenize (HTTP {reply.status})"
        id_lists.append([int(t) for t in tokens])
    return fingerprint_ids(id_lists), "probed"


async def engine_version(upstream: Upstream) -> str | None:
    from openenv_harness.recorder.upstream.base import UpstreamFailure

    try:
        reply = await upstream.request("GET", "/version")
    except UpstreamFailure:
        return None
    version = reply.json.get("version") if reply.status == 200 and reply.json else None
    return version if isinstance(version, str) else None


async def engine_models(upstream: Upstream) -> dict[str, Any]:
    """What ``GET /v1/models`` says: served names and the context length (vLLM's ``max_model_len``),
    so a session's context window follows the engine rather than a guess."""
    from openenv_harness.recorder.upstream.base import UpstreamFailure

    try:
        reply = await upstream.request("GET", "/v1/models")
    except UpstreamFailure:
        return {}
    data = (reply.json or {}).get("data") if reply.status == 200 else None
    if not isinstance(data, list):
        return {}
    names = [m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
    lengths = [m["max_model_len"] for m in data if isinstance(m, dict) and isinstance(m.get("max_model_len"), int)]
    out: dict[str, Any] = {"served_models": names}
    if lengths:
        out["max_model_len"] = min(lengths)
    return out


async def engine_sampling_defaults(upstream: Upstream, model: str | None) -> dict[str, Any] | None:
    """The sampling values the engine fills in for fields a request leaves out, where it says so:
    vLLM's render route (``--enable-scale-out``) answers a request without sampling fields with the
    ``sampling_params`` it would use -- the model's generation-config defaults included. None where
    the engine has no such route (then they are "unknown", unless configured)."""
    from openenv_harness.recorder.upstream.base import UpstreamFailure

    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}
    if model:
        body["model"] = model
    try:
        reply = await upstream.request("POST", RENDER, json=body)
    except UpstreamFailure:
        return None
    params = (reply.json or {}).get("sampling_params") if reply.status == 200 else None
    if not isinstance(params, dict):
        return None
    return {k: params[k] for k in DEFAULTED_FIELDS if k in params and params[k] is not None}


#: Fields whose engine default applies when a request leaves them out (vLLM takes them from the
#: model's ``generation_config.json`` unless started with ``--generation-config vllm``).
DEFAULTED_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                    "frequency_penalty")

#: Request fields that constrain decoding: under them the engine masks the policy's distribution
#: before sampling, and vLLM's returned logprobs are taken after the mask (a forced token about
#: -1e-5, masked alternatives -9999) -- sampled ids still, but not the policy's logprobs.
_GUIDED_FIELDS = ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                  "guided_decoding_backend", "structural_tag")


def decoding_constraint(body: dict[str, Any]) -> dict[str, Any] | None:
    """What constrains this call's decoding, or None for the model's own distribution."""
    found: dict[str, Any] = {}
    choice = body.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        found["tool_choice"] = choice
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        found["response_format"] = fmt.get("type")
    # a tool declared strict has its call's envelope and arguments forced by the engine's structural tag
    # (vLLM's hermes-family parsers), whatever tool_choice says
    tools = body.get("tools")
    strict = [str((t.get("function") or t).get("name")) for t in tools if isinstance(t, dict)
              and (t.get("function") or t).get("strict") is True] if isinstance(tools, list) else []
    if strict:
        found["strict_tools"] = strict
    for name in _GUIDED_FIELDS:
        if body.get(name) is not None:
            found[name] = body[name] if name != "structured_outputs" else sorted(body[name]) \
                if isinstance(body[name], dict) else True
    return found or None


#: The logprobs-mode probe: one prompt's top logprobs at the first sampled position, at two
#: temperatures. Raw logprobs (vLLM's default, before temperature) keep the gap between the likeliest
#: token and the least likely of the top ``LOGPROBS_PROBE_TOP``; processed ones (the distribution sampled
#: from) divide it by the temperature. The widest gap of the five, not the top two's: an engine whose
#: logits are bf16 reports gaps in steps of 1/16 nat or so, too coarse for a small top-2 gap (SGLang on
#: this probe: 0.625 at temperature 1, 0.375 at 2, where its wider gaps halve exactly).
LOGPROBS_PROBE_TEMPERATURES = (1.0, 2.0)
LOGPROBS_PROBE_TOP = 5
_LOGPROBS_PROBE_MESSAGES = [{"role": "user", "content": "Name one prime number."}]
#: the gap ratio (second temperature over first) each mode gives, and how far a measurement may be from it
_MODE_RATIOS = {"raw_logprobs": 1.0, "processed_logprobs": 1.0 / LOGPROBS_PROBE_TEMPERATURES[1]}
_RATIO_TOLERANCE = 0.1


def _top_gap(reply_json: dict[str, Any] | None) -> float | None:
    """The gap between the likeliest of the first position's top logprobs and the least likely finite one,
    or None if the reply has fewer than two."""
    try:
        content = reply_json["choices"][0]["logprobs"]["content"]  # type: ignore[index]
        values = sorted((float(t["logprob"]) for t in content[0]["top_logprobs"]), reverse=True)
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    values = [v for v in values if v > -1e8]
    if len(values) < 2:
        return None
    return values[0] - values[-1]


async def measure_logprobs_mode(upstream: Upstream, model: str | None = None) -> tuple[str, str]:
    """``(mode, how)``: ``raw_logprobs`` or ``processed_logprobs`` as measured on the engine, or
    ``unknown`` with the reason. Two one-token calls, nothing recorded: what the engine's logprobs are
    decides whether a trainer's importance ratios at a temperature other than 1 mean anything, so it is
    measured rather than taken from a flag someone may have set differently."""
    from openenv_harness.recorder.upstream.base import UpstreamFailure

    gaps: list[float] = []
    for temperature in LOGPROBS_PROBE_TEMPERATURES:
        body: dict[str, Any] = {"messages": _LOGPROBS_PROBE_MESSAGES, "max_tokens": 1, "logprobs": True,
                                "top_logprobs": LOGPROBS_PROBE_TOP, "temperature": temperature, "top_p": 1.0, "seed": 0}
        if model:
            body["model"] = model
        try:
            reply = await upstream.request("POST", "/v1/chat/completions", json=body)
        except UpstreamFailure as exc:
            return "unknown", f"not measured: the engine was unreachable ({exc.kind})"
        gap = _top_gap(reply.json) if reply.status == 200 else None
        if gap is None:
            return "unknown", f"not measured: no top logprobs at temperature {temperature:g} (HTTP {reply.status})"
        gaps.append(gap)
    if gaps[0] <= 1e-6:
        return "unknown", "not measured: the probe's two most likely tokens tie"
    ratio = gaps[1] / gaps[0]
    how = (f"measured: top-{LOGPROBS_PROBE_TOP} gap {gaps[0]:.4f} at temperature {LOGPROBS_PROBE_TEMPERATURES[0]:g}, {gaps[1]:.4f} at "
           f"{LOGPROBS_PROBE_TEMPERATURES[1]:g}")
    for mode, expected in _MODE_RATIOS.items():
        if abs(ratio - expected) <= _RATIO_TOLERANCE * expected:
            return mode, how
    return "unknown", how + f" (ratio {ratio:.3f}: neither raw nor processed)"
