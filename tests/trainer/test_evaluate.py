"""The held-out evaluation's intervals, against published values."""

from __future__ import annotations

import pytest

from openenv_harness.trainer.evaluate import EvalOutcome, EvalReport, newcombe_difference, wilson


def test_wilson_matches_newcombes_published_intervals() -> None:
    # Newcombe (1998), Statistics in Medicine 17, table I: 81/263 -> 0.2553-0.3662; 15/148 -> 0.0624-0.1605
    assert wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert wilson(15, 148) == pytest.approx((0.0624, 0.1605), abs=1e-4)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == pytest.approx(1.0)


def test_newcombe_difference_matches_the_published_example() -> None:
    # Newcombe (1998), Statistics in Medicine 17, table II, example (a): 56/70 - 48/80 -> 0.0524, 0.3339
    low, high = newcombe_difference(48, 80, 56, 70)
    assert (low, high) == pytest.approx((0.0524, 0.3339), abs=1e-4)


def test_a_report_counts_unscored_rollouts_apart() -> None:
    report = EvalReport("base", [EvalOutcome("a", 0, 1.0, 2), EvalOutcome("b", 0, 0.0, 3),
                                 EvalOutcome("c", 0, None, 0, "verifier could not run")])
    assert (report.successes, len(report.scored), report.rate()) == (1, 2, 0.5)
    data = report.as_dict()
    assert data["unscored"] == 1 and data["interval95"] == list(wilson(1, 2))
    assert report.by_level({"a": 1, "b": 2}) == {"1": (1, 1), "2": (0, 1)}
    with pytest.raises(ValueError):
        wilson(0, 0)
