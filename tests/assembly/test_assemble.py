import time

import pytest

from openenv_harness.assembly import AssemblyError, assemble_session, compare_strategies

FISH, ING, FISHING = 201, 202, 203


def _drifted_pair(toy, *, second_completion=(7, 5)):
    """Call 0 sampled [fish, ing, eot]; call 1's prompt replays it as [fishing]."""
    messages = [("system", [11]), ("user", [21])]
    p0 = toy.render(messages)
    p1 = toy.render(messages + [("assistant", [FISHING]), ("tool", [301])])
    return (
        p0,
        p1,
        [
            toy.record(p0, [FISH, ING, toy.EOT], call_index=0, logps=[-0.1, -0.2, -0.3]),
            toy.record(p1, list(second_completion), call_index=1, logps=[-0.4] * len(second_completion)),
        ],
    )


def test_exact_chain_is_one_sample_equal_to_the_last_prompt_plus_reply(toy) -> None:
    messages = [("system", [11]), ("user", [21])]
    p0 = toy.render(messages)
    c0 = [100, 101, toy.EOT]
    p1 = toy.render(messages + [("assistant", [100, 101]), ("tool", [301, 302])])
    c1 = [102, toy.EOT]
    session = assemble_session(
        [
            toy.record(p0, c0, call_index=0, logps=[-0.1, -0.2, -0.3]),
            toy.record(p1, c1, call_index=1, logps=[-0.5, -0.6]),
        ]
    )
    (trace,) = session.traces
    assert trace.prompt_ids == p0
    assert trace.input_ids == p1 + c1
    interstitial = p1[len(p0) + len(c0) :]
    assert interstitial == [toy.NL, toy.TOOL, 301, 302, toy.EOT, toy.NL, toy.ASSIST]
    assert trace.response_ids == c0 + interstitial + c1
    assert trace.loss_mask == [1, 1, 1] + [0] * len(interstitial) + [1, 1]
    assert trace.response_logprobs == [-0.1, -0.2, -0.3] + [0.0] * len(interstitial) + [-0.5, -0.6]
    assert trace.reward is None
    assert trace.metadata.node_ids == ["sess/0", "sess/1"] and trace.metadata.exact == 1
    assert not trace.metadata.approximate
    assert session.eot_id == toy.EOT
    assert session.stats.exact == 1 and session.stats.replay_drift == 0 and session.stats.breaks == 0


def test_reply_cut_by_length_gets_the_template_eot_as_context(toy) -> None:
    messages = [("user", [21])]
    p0 = toy.render(messages)
    c0 = [100, 101]  # finish "length": no end-of-turn sampled
    p1 = toy.render(messages + [("assistant", c0), ("user", [22])])
    session = assemble_session(
        [toy.record(p0, c0, call_index=0, finish_reason="length"), toy.record(p1, [9, toy.EOT], call_index=1)]
    )
    (trace,) = session.traces
    assert trace.response_ids[:3] == [100, 101, toy.EOT]
    assert trace.loss_mask[:3] == [1, 1, 0]  # the model never sampled that end-of-turn
    assert trace.input_ids == p1 + [9, toy.EOT]
    assert session.eot_id == toy.EOT  # detected from call 1, the first natural stop


def test_split_keeps_every_action_trainable_on_its_exact_prompt(toy) -> None:
    p0, p1, records = _drifted_pair(toy)
    session = assemble_session(records)
    first, second = session.traces
    assert first.input_ids == p0 + [FISH, ING, toy.EOT] and first.metadata.ended_by == "replay_drift"
    assert second.prompt_ids == p1 and second.response_ids == [7, 5] and second.metadata.sample_index == 1
    assert first.trainable_tokens + second.trainable_tokens == 5
    assert session.stats.resolutions.split == 1 and session.stats.replay_drift == 1
    assert session.stats.trainable_ratio == 1.0
    assert session.stats.trainable_ratio_all_tokens == pytest.approx(5 / (len(p0) + 3 + len(p1) + 2))


def test_realign_replaces_the_drifted_reply_with_its_canonical_replay(toy) -> None:
    p0, p1, records = _drifted_pair(toy)
    session = assemble_session(records, strategy="realign")
    (trace,) = session.traces
    assert trace.prompt_ids == p0
    assert trace.input_ids == p1 + [7, 5]
    assert trace.loss_mask == [0] * (len(p1) - len(p0)) + [1, 1]
    assert trace.metadata.realigned_node_ids == ["sess/0"] and trace.metadata.lost_tokens == 3
    assert [s.node_id for s in trace.metadata.segments] == ["sess/1"]
    assert session.stats.resolutions.realigned == 1 and session.stats.resolutions.lost_tokens == 3


def test_realign_keeps_the_exact_prefix_of_a_drifted_reply_trainable(toy) -> None:
    """Call 0 sampled [21, fish, ing, eot]; the replay is [21, fishing]: the 21 stays trainable."""
    messages = [("system", [11]), ("user", [21])]
    p0 = toy.render(messages)
    p1 = toy.render(messages + [("assistant", [21, FISHING]), ("tool", [301])])
    records = [toy.record(p0, [21, FISH, ING, toy.EOT], call_index=0, logps=[-0.1, -0.2, -0.3, -0.4]),
               toy.record(p1, [7, 5], call_index=1, logps=[-0.5, -0.6])]
    session = assemble_session(records, strategy="realign")
    (trace,) = session.traces
    assert trace.input_ids == p1 + [7, 5]
    assert trace.loss_mask == [1] + [0] * (len(p1) - len(p0) - 1) + [1, 1]
    assert trace.response_logprobs[0] == -0.1
    first, last = trace.metadata.segments
    assert (first.node_id, first.length, first.partial, first.trainable_tokens) == ("sess/0", 1, True, 1)
    assert (last.node_id, last.partial) == ("sess/1", False)
    assert trace.metadata.lost_tokens == 3 and session.stats.trainable_tokens == 3
    split = assemble_session(records, strategy="split")
    assert split.stats.trainable_tokens - session.stats.trainable_tokens == 3


def test_realign_gate_is_on_the_incoming_completion_length(toy) -> None:
    _, _, records = _drifted_pair(toy, second_completion=(7, 8, 5))
    gated = assemble_session(records, strategy="realign", realign_max_tokens=3)
    assert len(gated.traces) == 2 and gated.stats.resolutions.realign_gated == 1
    assert gated.stats.resolutions.realigned == 0
    allowed = assemble_session(records, strategy="realign", realign_max_tokens=4)
    assert len(allowed.traces) == 1 and allowed.stats.resolutions.realigned == 1


def test_approximate_splices_and_says_so(toy) -> None:
    p0, p1, records = _drifted_pair(toy)
    session = assemble_session(records, strategy="approximate")
    (trace,) = session.traces
    assert trace.metadata.approximate and trace.metadata.spliced_node_ids == ["sess/0"]
    # sampled reply kept verbatim, then the next prompt after its replayed end-of-turn
    eot_at = p1.index(toy.EOT, len(p0))
    assert trace.response_ids == [FISH, ING, toy.EOT] + p1[eot_at + 1 :] + [7, 5]
    assert trace.loss_mask.count(1) == 5
    assert session.stats.resolutions.spliced == 1 and session.stats.approximate_traces == 1


def test_approximate_with_a_length_cut_reply_keeps_the_template_eot(toy) -> None:
    messages = [("user", [21])]
    p0 = toy.render(messages)
    p1 = toy.render(messages + [("assistant", [FISHING]), ("user", [22])])
    records = [
        toy.record(p0, [FISH, ING], call_index=0, finish_reason="length"),
        toy.record(p1, [9, toy.EOT], call_index=1),
    ]
    (trace,) = assemble_session(records, strategy="approximate").traces
    eot_at = p1.index(toy.EOT, len(p0))
    assert trace.response_ids == [FISH, ING] + p1[eot_at:] + [9, toy.EOT]


def test_approximate_without_an_eot_falls_back_to_split(toy) -> None:
    _, _, records = _drifted_pair(toy)
    for entry in records:
        entry["metadata"]["finish_reason"] = "length"
        entry["response"]["choices"][0]["finish_reason"] = "length"
    session = assemble_session(records, strategy="approximate")
    assert session.eot_id is None
    assert len(session.traces) == 2 and not any(t.metadata.approximate for t in session.traces)
    assert session.stats.resolutions.splice_fallback == 1
    explicit = assemble_session(records, strategy="approximate", eot_id=toy.EOT)
    assert len(explicit.traces) == 1 and explicit.traces[0].metadata.approximate


def test_a_break_forks_and_keeps_both_sides(toy) -> None:
    p0 = toy.render([("system", [11]), ("user", [21])])
    p1 = p0 + [100, toy.EOT, toy.NL, toy.TOOL, 3, toy.EOT, toy.NL, toy.ASSIST]
    compacted = toy.render([("system", [11]), ("user", [77])])
    records = [
        toy.record(p0, [100, toy.EOT], call_index=0),
        toy.record(p1, [101, toy.EOT], call_index=1),
        toy.record(compacted, [102, toy.EOT], call_index=2),
    ]
    for strategy in ("split", "realign", "approximate"):
        session = assemble_session(records, strategy=strategy)
        assert [t.input_ids for t in session.traces] == [p1 + [101, toy.EOT], compacted + [102, toy.EOT]]
        assert session.stats.breaks == 1 and session.stats.break_causes == {"history_rewrite": 1}


def test_untrainable_and_excluded_records(toy) -> None:
    p0 = toy.render([("user", [21])])
    p1 = p0 + [100, toy.EOT, toy.NL, toy.USER, 22, toy.EOT, toy.NL, toy.ASSIST]
    p2 = p1 + [101, toy.EOT, toy.NL, toy.USER, 23, toy.EOT, toy.NL, toy.ASSIST]
    records = [
        toy.record(p0, [100, toy.EOT], call_index=0, trainable=False, logps=[0.7, float("nan")]),
        toy.record([1, 2], [3], call_index=1, call_kind="aux"),
        toy.record(p1, [101, toy.EOT], call_index=2, status="invalid"),
        toy.record(p2, [102, toy.EOT], call_index=3),
    ]
    session = assemble_session(records)
    (trace,) = session.traces
    assert trace.metadata.node_ids == ["sess/0", "sess/3"]
    assert trace.input_ids == p2 + [102, toy.EOT]
    # untrainable call: its sampled ids are context; the invalid call's reply is replayed context
    assert trace.loss_mask == [0] * (len(p2) - len(p0)) + [1, 1]
    assert set(trace.response_logprobs[: len(p2) - len(p0)]) == {0.0}
    assert session.stats.excluded == {"aux": 1, "invalid": 1} and session.stats.calls == 2
    assert session.stats.trainable_ratio == pytest.approx(2 / len(trace.response_ids))


def test_reward_is_stamped_and_none_stays_none(toy) -> None:
    _, _, records = _drifted_pair(toy)
    assert all(t.reward is None for t in assemble_session(records).traces)
    assert [t.reward for t in assemble_session(records, reward=0.0).traces] == [0.0, 0.0]
    with pytest.raises(AssemblyError, match="reward"):
        assemble_session(records, reward=float("nan"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"strategy": "merge"}, "unknown strategy"),
        ({"eot_id": -1}, "eot_id"),
        ({"realign_max_tokens": -5}, "realign_max_tokens"),
    ],
)
def test_bad_options_are_rejected(toy, options, message: str) -> None:
    with pytest.raises(AssemblyError, match=message):
        assemble_session([toy.record([1], [2], call_index=0)], **options)


def test_empty_session(toy) -> None:
    session = assemble_session([])
    assert session.traces == [] and session.stats.trainable_ratio is None and session.session_id is None


def test_compare_strategies_reports_each_ratio(toy) -> None:
    _, _, records = _drifted_pair(toy)
    stats = compare_strategies(records)
    assert set(stats) == {"split", "realign", "approximate"}
    assert stats["split"].trainable_ratio == 1.0
    assert stats["realign"].trainable_tokens == stats["split"].trainable_tokens - 3
    assert stats["approximate"].trainable_tokens == stats["split"].trainable_tokens
    assert stats["split"].trainable_ratio_all_tokens < stats["approximate"].trainable_ratio_all_tokens


def test_long_session_assembles_quickly(toy) -> None:
    """100 calls whose prompts grow to 20k tokens, every reply drifting at the end (worst case for split)."""
    messages = [("system", list(range(1000, 3000))), ("user", list(range(3000, 3100)))]
    records = []
    for turn in range(100):
        body = [10_000 + turn * 7 + k for k in range(40)]
        records.append(toy.record(toy.render(messages), body + [FISH, ING, toy.EOT], call_index=turn))
        messages += [("assistant", body + [FISHING]), ("tool", list(range(20_000, 20_130)))]
    assert len(records[-1]["prompt_token_ids"]) > 19_000
    started = time.perf_counter()
    for strategy in ("split", "realign", "approximate"):
        session = assemble_session(records, strategy=strategy)
        assert session.stats.replay_drift == 99 and len(session.chains) == 1
    elapsed = time.perf_counter() - started
    assert elapsed < 10.0, f"assembly took {elapsed:.1f}s"
