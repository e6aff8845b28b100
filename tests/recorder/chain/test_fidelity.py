"""Fidelity classification compares canonical prompt ids with prompt ids, never decodes."""

from __future__ import annotations

from array import array

from openenv_harness.recorder.chain.fidelity import FidelityTracker, common_prefix_len


def a(xs: list[int]) -> array:
    return array("I", xs)


def test_common_prefix_len() -> None:
    assert common_prefix_len(b"abcdef", b"abcxyz") == 3
    assert common_prefix_len(b"abc", b"abc") == 3
    assert common_prefix_len(b"", b"abc") == 0
    assert common_prefix_len(b"x" * 10000 + b"a", b"x" * 10000 + b"b") == 10000


def test_exact_drift_break_root() -> None:
    t = FidelityTracker()
    assert t.observe("s/0", a([1, 2, 3]), a([10, 11])).fidelity == "root"
    exact = t.observe("s/1", a([1, 2, 3, 10, 11, 5, 6]), a([12]))
    assert (exact.fidelity, exact.parent) == ("exact", "s/0")
    # the sampled [12] came back as [99]: same prompt prefix, re-tokenized answer
    drift = t.observe("s/2", a([1, 2, 3, 10, 11, 5, 6, 99, 7]), a([13]))
    assert (drift.fidelity, drift.parent, drift.divergence_at, drift.drift_tokens) == ("replay_drift", "s/1", 7, 2)
    # compaction: history rewritten, only the system prefix [1, 2] is shared
    brk = t.observe("s/3", a([1, 2, 50, 51]), a([14]))
    assert (brk.fidelity, brk.divergence_at, brk.drift_tokens) == ("break", 2, 2)
    # the old chain continues (sub-agent interleaving): it is found again
    cont = t.observe("s/4", a([1, 2, 3, 10, 11, 5, 6, 99, 7, 13, 8]), a([15]))
    assert (cont.fidelity, cont.parent) == ("exact", "s/2")


def test_sampled_ids_are_never_the_grouping_key() -> None:
    """[fish, ing] sampled, [fishing] in the next prompt: still the same chain (drift, not break)."""
    t = FidelityTracker()
    t.observe("s/0", a([1, 2]), a([300, 301]))
    nxt = t.observe("s/1", a([1, 2, 999, 4]), a([5]))
    assert nxt.fidelity == "replay_drift" and nxt.parent == "s/0" and nxt.divergence_at == 2
