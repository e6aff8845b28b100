"""The sampling a record was drawn under, as a trainer must reproduce it -- or refuse it.

An importance ratio ``exp(logp_trainer - logp_rollout)`` is only meaningful when both logprobs are
of the same distribution: the one the engine *sampled from*. Two things decide what the recorded
``logp_rollout`` is, and both are in every record's provenance:

- the effective sampling (``provenance.sampling_effective``): temperature, truncation (top-p, top-k,
  min-p) and penalties as the engine applied them, its defaults included;
- the engine's logprobs mode (``provenance.logprobs_mode``, measured by the recorder): vLLM's
  ``raw_logprobs`` are the model's distribution *before* temperature and truncation,
  ``processed_logprobs`` the distribution after them -- the one actually sampled from.

What a trainer can reproduce from its own logits: temperature (divide the logits by it). With
processed logprobs the recorded value is ``log_softmax(logits / T)``, so the trainer scores that;
with raw logprobs the recorded value is ``log_softmax(logits)`` whatever T was, which is the
sampling policy's only at T = 1 -- at any other temperature the records carry the logprobs of a
policy that sampled nothing, and are refused. Truncated sampling and penalties are refused too: the
renormalised distribution needs the engine's exact cut-off (which token fell out at the boundary),
and a penalty depends on the whole generated history; rather than approximate either, the trainer
says so and names the policy that trains (``TRAINING_POLICY``). Greedy decoding (T = 0) has no
distribution to correct against.

Pure Python: the scorers (``verify.py``, ``grpo.py``) apply ``RecordedSampling.temperature_divisor``
to their logits; nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The training sampling policy: the whole vocabulary at temperature 1 with no penalty -- exactly what
#: a trainer's plain log-softmax scores, whatever the engine's logprobs mode. A session can pin
#: another temperature; the rest must stay neutral for the trainer to reproduce the distribution.
TRAINING_POLICY: dict[str, Any] = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                                   "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}

#: The value of each narrowing knob that leaves the distribution whole (top_k: vLLM reads 0 and -1 as off)
NEUTRAL: dict[str, tuple[float, ...]] = {"top_p": (1.0,), "top_k": (-1, 0), "min_p": (0.0,),
                                         "repetition_penalty": (1.0,), "presence_penalty": (0.0,),
                                         "frequency_penalty": (0.0,)}
TRUNCATION = ("top_p", "top_k", "min_p")
PENALTIES = ("repetition_penalty", "presence_penalty", "frequency_penalty")
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")


class UnreproducibleSampling(ValueError):
    """Records whose sampling the trainer cannot score as the engine sampled; the message says which
    records, why, and what to change."""


def is_neutral(name: str, value: Any) -> bool:
    """True when ``value`` of knob ``name`` leaves the distribution whole (None: the knob was not set)."""
    if value is None:
        return True
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return any(math.isclose(number, n) for n in NEUTRAL[name])


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None (absent, not a number, NaN or infinite)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


@dataclass(frozen=True)
class RecordedSampling:
    """What one record says about how its ids were sampled and what its logprobs are."""

    temperature: float | None
    logprobs_mode: str
    #: narrowing knobs in force with a non-neutral value (top_p 0.8, top_k 20, ...)
    truncation: dict[str, Any] = field(default_factory=dict)
    penalties: dict[str, Any] = field(default_factory=dict)
    #: sampling fields whose value nobody stated (the engine filled them in from defaults nobody read)
    unknown: tuple[str, ...] = ()

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> RecordedSampling:
        provenance = (record.get("metadata") or {}).get("provenance") or {}
        effective = provenance.get("sampling_effective") or {}
        unknown = tuple(str(name) for name in provenance.get("sampling_unknown") or ())
        temperature = _number(effective.get("temperature"))
        if effective.get("temperature") is not None and temperature is None:
            unknown = (*unknown, "temperature")  # a value that is not a finite number says nothing usable
        return cls(
            temperature=temperature,
            logprobs_mode=str(provenance.get("logprobs_mode") or "unknown"),
            truncation={k: effective[k] for k in TRUNCATION if not is_neutral(k, effective.get(k))},
            penalties={k: effective[k] for k in PENALTIES if not is_neutral(k, effective.get(k))},
            unknown=unknown,
        )

    def problems(self) -> list[str]:
        """Why a trainer cannot reproduce this record's sampling distribution (empty: it can)."""
        out: list[str] = []
        if self.temperature is None or "temperature" in self.unknown:
            out.append("its sampling temperature is unknown (the engine applied a default nobody recorded)")
        elif self.temperature <= 0:
            out.append("it was decoded greedily (temperature 0): there is no sampling distribution to correct against")
        hidden = [name for name in (*TRUNCATION, *PENALTIES) if name in self.unknown]
        if hidden:
            out.append(f"{', '.join(hidden)} unknown (the engine's defaults may truncate or penalise)")
        if self.truncation:
            out.append("truncated sampling (" + ", ".join(f"{k}={v}" for k, v in self.truncation.items())
                       + ") is not reproduced by the trainer")
        if self.penalties:
            out.append("sampling penalties (" + ", ".join(f"{k}={v}" for k, v in self.penalties.items())
                       + ") are not reproduced by the trainer")
        if self.temperature is not None and self.temperature > 0 and not math.isclose(self.temperature, 1.0):
            if self.logprobs_mode == "raw_logprobs":
                out.append(f"the engine's logprobs are raw (before temperature): at temperature {self.temperature:g} "
                           "they are not the sampling policy's")
            elif self.logprobs_mode not in LOGPROBS_MODES:
                out.append(f"the engine's logprobs mode is {self.logprobs_mode!r}: at temperature "
                           f"{self.temperature:g} raw and processed logprobs differ")
        return out

    @property
    def temperature_divisor(self) -> float:
        """What the trainer divides its logits by so that its logprobs are the recorded quantity:
        the temperature for processed logprobs, 1 for raw ones (only reproducible at T = 1)."""
        if self.logprobs_mode == "processed_logprobs" and self.temperature:
            return self.temperature
        return 1.0


REMEDY = ("record with a full-vocabulary training policy (temperature > 0, top_p 1, top_k -1, min_p 0, no "
          "penalties: `--training-sampling` on run / train-demo, or SessionSpec.training_sampling); at a temperature "
          "other than 1 the engine must serve processed logprobs (vLLM --logprobs-mode processed_logprobs)")


def node_of(record: Mapping[str, Any]) -> str:
    """The name a refusal gives a record: its node id, else its call index."""
    metadata = record.get("metadata") or {}
    return str(metadata.get("node_id") or f"call {metadata.get('call_index', '?')}")


def refusal_message(bad: Sequence[tuple[str, Sequence[str]]]) -> str:
    """One line naming the first records that cannot be reproduced, why, and what to change."""
    more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
    return (f"{len(bad)} record(s) cannot be scored as they were sampled -- "
            + " | ".join(f"{node}: {'; '.join(reasons)}" for node, reasons in bad[:3]) + more
            + f". To train on them, {REMEDY}")


def require_reproducible(records: Iterable[Mapping[str, Any]]) -> dict[str, RecordedSampling]:
    """Each record's sampling by node id; raises ``UnreproducibleSampling`` naming the first records that
    cannot be reproduced (and why) -- a trainer refuses them rather than train on another policy's ratios."""
    out: dict[str, RecordedSampling] = {}
    bad: list[tuple[str, list[str]]] = []
    for record in records:
        node = node_of(record)
        sampling = RecordedSampling.of(record)
        reasons = sampling.problems()
        if reasons:
            bad.append((node, reasons))
        out[node] = sampling
    if bad:
        raise UnreproducibleSampling(refusal_message(bad))
    return out
