"""The recorded sampling as a trainer must reproduce it: which records it scores, what it divides its
logits by, and the refusal (naming each record and why) for the ones it cannot reproduce."""

from __future__ import annotations

import math
from typing import Any

import pytest

from openenv_harness.trainer.sampling import (
    TRAINING_POLICY,
    RecordedSampling,
    UnreproducibleSampling,
    is_neutral,
    refusal_message,
    require_reproducible,
)


def record(node: str = "s/0", mode: str | None = "raw_logprobs", unknown: tuple[str, ...] = (),
           **effective: Any) -> dict[str, Any]:
    """A record whose provenance says it was sampled under ``effective`` (the training policy's values
    where not given; a value of None drops the field)."""
    values = {**TRAINING_POLICY, **effective}
    provenance: dict[str, Any] = {"sampling_effective": {k: v for k, v in values.items() if v is not None},
                                  "sampling_unknown": list(unknown)}
    if mode is not None:
        provenance["logprobs_mode"] = mode
    return {"metadata": {"node_id": node, "call_index": 0, "provenance": provenance}}


def test_the_training_policy_is_reproduced_whatever_the_logprobs_mode() -> None:
    for mode in ("raw_logprobs", "processed_logprobs", None):
        sampling = RecordedSampling.of(record(mode=mode))
        assert sampling.problems() == [], mode
        assert sampling.temperature_divisor == 1.0
    assert RecordedSampling.of(record(mode=None)).logprobs_mode == "unknown"
    # vLLM reads top_k 0 and -1 both as "off"; absent knobs are not in force
    assert RecordedSampling.of(record(top_k=0, min_p=None)).problems() == []


def test_processed_logprobs_at_another_temperature_are_scored_at_that_temperature() -> None:
    sampling = RecordedSampling.of(record(mode="processed_logprobs", temperature=0.7))
    assert sampling.problems() == [] and sampling.temperature_divisor == pytest.approx(0.7)


def test_raw_logprobs_at_another_temperature_are_refused_with_the_reason() -> None:
    problems = RecordedSampling.of(record(mode="raw_logprobs", temperature=0.7)).problems()
    assert len(problems) == 1 and "raw (before temperature): at temperature 0.7" in problems[0]
    unknown_mode = RecordedSampling.of(record(mode=None, temperature=1.3)).problems()
    assert len(unknown_mode) == 1 and "logprobs mode is 'unknown'" in unknown_mode[0]
    # raw at T != 1 is never scored as if it were T = 1
    assert RecordedSampling.of(record(mode="raw_logprobs", temperature=0.7)).temperature_divisor == 1.0


@pytest.mark.parametrize("knob, value", [("top_p", 0.8), ("top_k", 20), ("min_p", 0.05)])
def test_truncated_sampling_is_refused_even_with_processed_logprobs(knob: str, value: float) -> None:
    problems = RecordedSampling.of(record(mode="processed_logprobs", **{knob: value})).problems()
    assert len(problems) == 1 and f"truncated sampling ({knob}={value})" in problems[0]


@pytest.mark.parametrize("knob, value", [("repetition_penalty", 1.05), ("presence_penalty", 0.5),
                                         ("frequency_penalty", -0.2)])
def test_penalties_are_refused(knob: str, value: float) -> None:
    problems = RecordedSampling.of(record(**{knob: value})).problems()
    assert len(problems) == 1 and f"sampling penalties ({knob}={value})" in problems[0]


def test_greedy_unknown_and_unreadable_temperatures_are_refused() -> None:
    assert "greedily" in RecordedSampling.of(record(temperature=0)).problems()[0]
    for rec in (record(temperature=None), record(unknown=("temperature",)), record(temperature="warm"),
                record(temperature=math.nan), {"metadata": {"node_id": "bare"}}):
        assert any("temperature is unknown" in p for p in RecordedSampling.of(rec).problems()), rec


def test_knobs_the_engine_filled_in_unseen_are_refused() -> None:
    problems = RecordedSampling.of(record(top_p=None, top_k=None, unknown=("top_p", "top_k"))).problems()
    assert problems == ["top_p, top_k unknown (the engine's defaults may truncate or penalise)"]


def test_neutral_values() -> None:
    assert is_neutral("top_p", None) and is_neutral("top_p", 1) and is_neutral("top_k", -1)
    assert not is_neutral("top_p", 0.95) and not is_neutral("top_k", "all") and not is_neutral("min_p", 0.1)


def test_require_reproducible_names_every_bad_record_and_the_remedy() -> None:
    good = record("s/0")
    assert set(require_reproducible([good])) == {"s/0"}
    bad = [record(f"s/{i}", temperature=0.7) for i in range(1, 6)]
    with pytest.raises(UnreproducibleSampling) as caught:
        require_reproducible([good, *bad])
    message = str(caught.value)
    assert message.startswith("5 record(s) cannot be scored as they were sampled -- s/1: ")
    assert "s/3" in message and "s/4" not in message and "(and 2 more)" in message
    assert "--logprobs-mode processed_logprobs" in message and "\n" not in message
    assert refusal_message([("a", ["x", "y"])]).startswith("1 record(s) cannot be scored as they were sampled -- a: x; y.")
