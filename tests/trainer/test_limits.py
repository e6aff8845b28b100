"""The step-0 statistics and the limits they are held to: each limit fails on its own, with the
numbers; the signed mean log ratio keeps its sign; the k3 KL estimate is never negative."""

from __future__ import annotations

import dataclasses
import math

import pytest

from openenv_harness.trainer.limits import DEFAULT_LIMITS, DeltaStats, LimitFailure, Limits


def test_the_statistics_of_paired_logprobs() -> None:
    rollout = [-1.0, -2.0, -0.5, -3.0]
    trainer = [-1.0, -1.9, -0.6, -3.2]
    st = DeltaStats.of(rollout, trainer, 0.05)
    assert st.tokens == 4
    assert st.delta_max == pytest.approx(0.2) and st.delta_mean == pytest.approx(0.1)
    assert st.delta_p99 == pytest.approx(0.2)
    assert st.mean_log_ratio == pytest.approx((0 + 0.1 - 0.1 - 0.2) / 4)
    assert st.ratio_min == pytest.approx(math.exp(-0.2)) and st.ratio_max == pytest.approx(math.exp(0.1))
    assert st.share_within == 0.25  # only the exact one: exp(±0.1) is outside 1 ± 0.05
    expected = sum(math.exp(d) - 1 - d for d in (0, 0.1, -0.1, -0.2)) / 4
    assert st.kl_k3 == pytest.approx(expected) and st.kl_k3 > 0


def test_the_mean_log_ratio_is_signed_and_the_k3_kl_is_not() -> None:
    up = DeltaStats.of([-1.0] * 5, [-0.5] * 5, 0.05)
    down = DeltaStats.of([-1.0] * 5, [-1.5] * 5, 0.05)
    assert up.mean_log_ratio == pytest.approx(0.5) and down.mean_log_ratio == pytest.approx(-0.5)
    assert up.kl_k3 is not None and down.kl_k3 is not None and up.kl_k3 > 0 and down.kl_k3 > 0
    assert DeltaStats.of([-1.0], [-1.0], 0.05).kl_k3 == 0.0


def test_unsampled_tokens_have_no_kl_estimate_and_huge_differences_do_not_overflow() -> None:
    assert DeltaStats.of([-1.0], [-2.0], 0.05, sampled=False).kl_k3 is None
    st = DeltaStats.of([-9999.0], [-0.1], 0.05)
    assert math.isfinite(st.ratio_max) and st.kl_k3 is not None and math.isfinite(st.kl_k3)
    assert DEFAULT_LIMITS.failures(st)


def test_mismatched_lengths_are_an_error_and_nothing_is_empty() -> None:
    with pytest.raises(ValueError, match="3 rollout logprobs against 2"):
        DeltaStats.of([-1.0, -1.0, -1.0], [-1.0, -1.0], 0.05)
    assert DeltaStats.of([], [], 0.05).tokens == 0


def test_statistics_at_the_floor_meet_the_default_limits() -> None:
    # 200 tokens, most within a few thousandths, a handful at a tenth: what bf16 against fp32 looks like
    diffs = [0.004 * ((i % 7) - 3) for i in range(195)] + [0.1, -0.12, 0.09, -0.08, 0.11]
    st = DeltaStats.of([-1.0] * 200, [-1.0 + d for d in diffs], DEFAULT_LIMITS.epsilon)
    assert DEFAULT_LIMITS.failures(st) == []


@pytest.mark.parametrize("stats, broken", [
    (DeltaStats(tokens=100, delta_mean=0.2, delta_p99=0.1, delta_max=0.1, share_within=0.9, kl_k3=1e-4), "delta_mean"),
    (DeltaStats(tokens=100, delta_mean=0.01, delta_p99=0.4, delta_max=0.45, share_within=0.9, kl_k3=1e-4), "delta_p99"),
    (DeltaStats(tokens=100, delta_mean=0.01, delta_p99=0.1, delta_max=2.0, share_within=0.9, kl_k3=1e-4), "delta_max"),
    (DeltaStats(tokens=100, delta_mean=0.01, delta_p99=0.1, delta_max=0.1, share_within=0.5, kl_k3=1e-4), "share_within"),
    (DeltaStats(tokens=100, delta_mean=0.01, delta_p99=0.1, delta_max=0.1, share_within=0.9, kl_k3=0.5), "kl_k3"),
    (DeltaStats(), "tokens"),
])
def test_each_limit_fails_on_its_own_with_the_numbers(stats: DeltaStats, broken: str) -> None:
    [failure] = DEFAULT_LIMITS.failures(stats)
    assert failure.limit == broken and failure.value == getattr(stats, broken)
    assert failure.bound == (1 if broken == "tokens" else getattr(DEFAULT_LIMITS, broken))
    assert f"{failure.bound:g}" in failure.text


def test_under_a_hundred_tokens_the_p99_is_the_maximum_and_only_the_maximums_limit_holds_it() -> None:
    from openenv_harness.trainer.limits import P99_MIN_TOKENS

    # a short rollout: 77 tokens at the floor and one at 0.37, as a real OpenCode rollout gave
    diffs = [0.004 * ((i % 7) - 3) for i in range(77)] + [0.37]
    short = DeltaStats.of([-1.0] * 78, [-1.0 + d for d in diffs], DEFAULT_LIMITS.epsilon)
    assert short.delta_p99 == short.delta_max == pytest.approx(0.37)  # 99 % of 78 tokens is all of them
    assert DEFAULT_LIMITS.failures(short) == []
    # the same token among enough others for a true percentile: still within, as it is one in a hundred...
    long = DeltaStats.of([-1.0] * P99_MIN_TOKENS, [-1.0 + d for d in [0.0] * (P99_MIN_TOKENS - 1) + [0.37]],
                         DEFAULT_LIMITS.epsilon)
    assert long.delta_p99 < 0.25 and DEFAULT_LIMITS.failures(long) == []
    # ... and a p99 that is not one token's fails from there on
    two = DeltaStats.of([-1.0] * P99_MIN_TOKENS, [-1.0 + d for d in [0.0] * (P99_MIN_TOKENS - 2) + [0.37, 0.37]],
                        DEFAULT_LIMITS.epsilon)
    assert [f.limit for f in DEFAULT_LIMITS.failures(two)] == ["delta_p99"]
    # under the threshold a mismatch still fails on the maximum and the mean
    assert {f.limit for f in DEFAULT_LIMITS.failures(DeltaStats.of([-1.0] * 20, [-3.0] * 20, 0.05))} >= {
        "delta_mean", "delta_max"}


def test_the_failure_text_says_which_limit_and_both_numbers() -> None:
    assert LimitFailure("delta_mean", 5.1634, 0.03).text == "mean |δ| 5.163 > 0.03"
    assert LimitFailure("share_within", 0.125, 0.8).text == "share of ratios within 1±ε 0.125 < 0.8"


def test_limits_can_be_overridden_but_not_nonsensically() -> None:
    loose = Limits(delta_mean=10, delta_p99=10, delta_max=10, share_within=0.0, kl_k3=10)
    assert loose.failures(DeltaStats(tokens=1, delta_mean=5, delta_p99=5, delta_max=5, share_within=0, kl_k3=1)) == []
    with pytest.raises(ValueError, match="delta_mean limit must be positive"):
        Limits(delta_mean=0)
    with pytest.raises(ValueError, match="share"):
        Limits(share_within=1.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_LIMITS.delta_mean = 1.0  # type: ignore[misc]  # frozen: the documented defaults stay put
