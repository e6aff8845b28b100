import pytest

from openenv_harness.assembly import (
    AssemblyError,
    LogprobDelta,
    assemble_session,
    logprob_delta,
    record_logprob_delta,
    summarize_deltas,
    trace_logprob_delta,
)


def test_delta_over_mask_one_positions_only() -> None:
    delta = logprob_delta([-0.1, -5.0, -0.4], [-0.2, -0.1, -0.1], [1, 0, 1])
    assert delta.tokens == 2
    assert delta.max_abs == pytest.approx(0.3)
    assert delta.mean_abs == pytest.approx(0.2)


def test_delta_without_trainable_positions_is_none_not_zero() -> None:
    assert logprob_delta([-1.0], [-2.0], [0]) == LogprobDelta(tokens=0, max_abs=None, mean_abs=None)


def test_delta_rejects_misaligned_or_non_finite_input() -> None:
    with pytest.raises(AssemblyError, match="misaligned"):
        logprob_delta([-0.1], [-0.1, -0.2], [1, 1])
    with pytest.raises(AssemblyError, match="non-finite"):
        logprob_delta([float("nan")], [-0.1], [1])


def test_trace_and_record_deltas(toy) -> None:
    p0 = toy.render([("user", [21])])
    p1 = toy.render([("user", [21]), ("assistant", [100]), ("tool", [301])])
    records = [
        toy.record(p0, [100, toy.EOT], call_index=0, logps=[-0.5, -0.1]),
        toy.record(p1, [101, toy.EOT], call_index=1, logps=[-0.3, -0.2]),
    ]
    (trace,) = assemble_session(records).traces
    trainer = [lp - 0.05 if m else -9.0 for lp, m in zip(trace.response_logprobs, trace.loss_mask, strict=True)]
    trainer[0] = -0.9  # one token drifted by 0.4
    delta = trace_logprob_delta(trace, trainer)
    assert delta.tokens == 4
    assert delta.max_abs == pytest.approx(0.4)
    assert delta.mean_abs == pytest.approx((0.4 + 0.05 * 3) / 4)

    per_record = record_logprob_delta(records[1], [-0.3, -0.25])
    assert (per_record.tokens, per_record.max_abs) == (2, pytest.approx(0.05))
    untrainable = toy.record(p0, [100, toy.EOT], call_index=2, trainable=False)
    assert record_logprob_delta(untrainable, [-1.0, -1.0]).tokens == 0

    combined = summarize_deltas([delta, per_record, LogprobDelta(tokens=0, max_abs=None, mean_abs=None)])
    assert combined.tokens == 6 and combined.max_abs == pytest.approx(0.4)
    assert combined.mean_abs == pytest.approx((delta.mean_abs * 4 + per_record.mean_abs * 2) / 6)
    assert summarize_deltas([]).mean_abs is None


def test_session_stats_count_transitions_and_causes(toy) -> None:
    base = [("system", [11, 12, 13, 14]), ("user", [21])]
    p0 = toy.render(base)
    p1 = toy.render(base + [("assistant", [203]), ("tool", [301])])  # sampled [201, 202]: drift
    p2 = toy.render(base + [("assistant", [203]), ("tool", [301]), ("assistant", [102]), ("tool", [302])])
    sub = toy.render([("system", [11, 99]), ("user", [31])])
    p3 = p2 + [103, toy.EOT]
    records = [
        toy.record(p0, [201, 202, toy.EOT], call_index=0),
        toy.record(p1, [102, toy.EOT], call_index=1),
        toy.record(sub, [7, toy.EOT], call_index=2),
        toy.record(p2, [103], call_index=3, finish_reason="length"),
        toy.record(p3, [104, toy.EOT], call_index=4),
    ]
    stats = assemble_session(records).stats
    assert (stats.calls, stats.chains, stats.exact, stats.replay_drift, stats.breaks) == (5, 2, 2, 1, 1)
    assert stats.break_causes == {"sub_agent": 1}
    assert stats.drift_tokens == 3 and stats.max_drift_tokens == 3
    assert stats.traces == 3 and stats.resolutions.split == 1
    assert stats.trainable_tokens == 3 + 2 + 2 + 1 + 2
    assert stats.trainable_ratio == pytest.approx(stats.trainable_tokens / stats.response_tokens)
