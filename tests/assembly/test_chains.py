from openenv_harness.assembly import group_chains, select_calls

FISH, ING, FISHING = 201, 202, 203


def _group(records):
    return group_chains(select_calls(records).calls)


def _conversation(toy, n_turns: int, *, system=(11, 12, 13), task=(21, 22), start_index=0, session="sess"):
    """An agent loop on the toy template where every reply comes back verbatim."""
    messages = [("system", list(system)), ("user", list(task))]
    records = []
    for turn in range(n_turns):
        body = [100 + turn, 150 + turn]
        records.append(
            toy.record(toy.render(messages), body + [toy.EOT], call_index=start_index + turn, session_id=session)
        )
        messages += [("assistant", body), ("tool", [300 + turn])]
    return records, messages


def test_verbatim_replies_form_one_exact_chain(toy) -> None:
    records, _ = _conversation(toy, 4)
    grouping = _group(records)
    assert [c.node_ids for c in grouping.chains] == [[r["metadata"]["node_id"] for r in records]]
    assert [t.kind for t in grouping.transitions] == ["exact"] * 3
    assert all(t.divergence is None and t.drift_tokens == 0 for t in grouping.transitions)


def test_retokenized_reply_stays_in_chain_as_replay_drift(toy) -> None:
    messages = [("system", [11]), ("user", [21])]
    p0 = toy.render(messages)
    # The engine sampled [fish, ing]; the harness sends the text back and it re-encodes as [fishing].
    p1 = toy.render(messages + [("assistant", [FISHING]), ("tool", [301])])
    grouping = _group([toy.record(p0, [FISH, ING, toy.EOT], call_index=0), toy.record(p1, [7, toy.EOT], call_index=1)])
    assert len(grouping.chains) == 1
    (transition,) = grouping.transitions
    assert transition.kind == "replay_drift"
    assert transition.divergence == len(p0)  # the very first replayed id differs
    assert transition.drift_tokens == 3  # fish, ing, eot were not reproduced as sampled
    assert transition.from_node == "sess/0" and transition.to_node == "sess/1"


def test_drift_position_points_inside_the_reply(toy) -> None:
    p0 = toy.render([("user", [21])])
    p1 = p0 + [100, FISHING, toy.EOT, toy.NL, toy.TOOL, 9, toy.EOT, toy.NL, toy.ASSIST]
    grouping = _group([toy.record(p0, [100, FISH, ING, toy.EOT], call_index=0), toy.record(p1, [7], call_index=1)])
    (transition,) = grouping.transitions
    assert (transition.kind, transition.divergence, transition.drift_tokens) == ("replay_drift", len(p0) + 1, 3)


def test_interleaved_sub_agent_gets_its_own_chain(toy) -> None:
    main, _ = _conversation(toy, 4, task=(21, 22))
    sub, _ = _conversation(toy, 2, system=(11, 99), task=(31,))
    # main 0, main 1, sub 0, main 2, sub 1, main 3
    ordered = [main[0], main[1], sub[0], main[2], sub[1], main[3]]
    for index, entry in enumerate(ordered):
        entry["metadata"].update(call_index=index, seq=index, node_id=f"sess/{index}")
    grouping = _group(ordered)
    assert [c.node_ids for c in grouping.chains] == [["sess/0", "sess/1", "sess/3", "sess/5"], ["sess/2", "sess/4"]]
    breaks = [t for t in grouping.transitions if t.kind == "break"]
    assert len(breaks) == 1 and breaks[0].cause == "sub_agent" and breaks[0].to_node == "sess/2"
    assert breaks[0].divergence == 2  # shares only <system> 11
    assert all(t.kind == "exact" for t in grouping.transitions if t.kind != "break")


def test_compaction_is_a_history_rewrite(toy) -> None:
    records, _ = _conversation(toy, 3)
    compacted = toy.render([("system", [11, 12, 13]), ("user", [77, 78])])
    records.append(toy.record(compacted, [5], call_index=3))
    records.append(
        toy.record(compacted + [5, toy.EOT, toy.NL, toy.TOOL, 1, toy.EOT, toy.NL, toy.ASSIST], [6], call_index=4)
    )
    grouping = _group(records)
    assert [len(c.calls) for c in grouping.chains] == [3, 2]
    (brk,) = [t for t in grouping.transitions if t.kind == "break"]
    assert brk.cause == "history_rewrite"
    assert brk.divergence == 7  # the system message and the <user> role id
    assert brk.from_node == "sess/2"  # best match: the latest, longest-sharing prompt


def test_rerendered_last_turn_is_a_retokenized_tail(toy) -> None:
    messages = [("system", [11, 12]), ("user", [21])]
    p0 = toy.render(messages)
    think = [401, 402]
    p1 = toy.render(messages + [("assistant", think + [100]), ("tool", [301])])
    # Next render drops the reasoning of the earlier reply: p1 is no longer a prefix.
    p2 = toy.render(messages + [("assistant", [100]), ("tool", [301]), ("assistant", [101]), ("tool", [302])])
    records = [
        toy.record(p0, think + [100, toy.EOT], call_index=0),
        toy.record(p1, [101, toy.EOT], call_index=1),
        toy.record(p2, [102, toy.EOT], call_index=2),
    ]
    grouping = _group(records)
    assert [c.node_ids for c in grouping.chains] == [["sess/0", "sess/1"], ["sess/2"]]
    brk = grouping.transition_into("sess/2")
    assert brk is not None and brk.kind == "break" and brk.cause == "retokenized_tail"
    assert brk.from_node == "sess/1" and brk.divergence == len(p0)


def test_identical_prompt_is_a_resample_not_a_continuation(toy) -> None:
    p0 = toy.render([("user", [21])])
    grouping = _group([toy.record(p0, [7, toy.EOT], call_index=0), toy.record(p0, [8, toy.EOT], call_index=1)])
    assert len(grouping.chains) == 2
    (brk,) = grouping.transitions
    assert (brk.kind, brk.cause, brk.divergence, brk.drift_tokens) == ("break", "resample", len(p0), 0)


def test_longest_matching_tip_wins(toy) -> None:
    base = toy.render([("user", [21])])
    short = toy.record(base, [7], call_index=0)
    longer = toy.record(base + [7, 8], [9], call_index=1)
    # call 1 extends call 0, so it joins; now a third call extending both tips of a fork:
    forked = toy.record(base + [1], [9], call_index=2)
    grouping = _group([short, longer, forked, toy.record(base + [7, 8, 9, 10], [4], call_index=3)])
    assert [c.node_ids for c in grouping.chains] == [["sess/0", "sess/1", "sess/3"], ["sess/2"]]


def test_grouping_never_reads_sampled_ids(toy) -> None:
    records, _ = _conversation(toy, 3)
    sub, _ = _conversation(toy, 2, system=(11, 98), start_index=3)
    records += sub
    before = _group(records)
    for entry in records:
        entry["completion_token_ids"] = [999] * (len(entry["completion_token_ids"]) + 2)
        entry["per_token_logps"] = [-1.0] * len(entry["completion_token_ids"])
        entry["loss_mask"] = [0] * len(entry["prompt_token_ids"]) + [1] * len(entry["completion_token_ids"])
    after = _group(records)
    assert [c.node_ids for c in after.chains] == [c.node_ids for c in before.chains]
    assert [t.kind for t in after.transitions if t.kind == "break"] == ["break"]
    assert all(t.kind == "replay_drift" for t in after.transitions if t.kind != "break")
