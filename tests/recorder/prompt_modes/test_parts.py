"""The incremental mode's pure parts: the render contrast and the per-engine facts it learns."""

from __future__ import annotations

import random
from array import array

from openenv_harness.recorder import history_match
from openenv_harness.recorder.prompt_modes.engine_facts import EngineFactsTable
from openenv_harness.recorder.prompt_modes.rendering import render_diff
from openenv_harness.recorder.prompt_modes.state import IncrementalState
from openenv_harness.recorder.upstream.base import Upstream, UpstreamReply


def _slow_diff(sampled: list[int], full: list[int]) -> tuple[int, int] | None:
    if sampled == full:
        return None
    n = min(len(sampled), len(full))
    start = next((i for i in range(n) if sampled[i] != full[i]), n)
    tail = 0
    while tail < n - start and sampled[-1 - tail] == full[-1 - tail]:
        tail += 1
    return start, tail


def test_render_diff_finds_the_differing_span() -> None:
    rng = random.Random(7)
    assert render_diff(array("I", [1, 2, 3]), array("I", [1, 2, 3]))["identical"] is True
    for _ in range(300):
        base = [rng.randrange(5) for _ in range(rng.randrange(0, 40))]
        sampled, full = list(base), list(base)
        at = rng.randrange(len(base) + 1)
        sampled[at:at + rng.randrange(3)] = [rng.randrange(5) for _ in range(rng.randrange(4))]
        expected = _slow_diff(sampled, full)
        got = render_diff(array("I", sampled), array("I", full))
        if expected is None:
            assert got["identical"]
            continue
        start, tail = expected
        assert (got["position"], got["sampled_span"], got["full_span"]) == \
            (start, len(sampled) - start - tail, len(full) - start - tail)


def test_message_digests_are_memoized_without_changing_them() -> None:
    state = IncrementalState()
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "reasoning_content": "think",
                 "tool_calls": [{"function": {"name": "bash", "arguments": '{"a":  1}'}}]}]
    assert state.digests(messages) == history_match.digests(messages) == state.digests(messages)
    assert len(state.digest_memo) == 2


class _Engine(Upstream):
    async def chat(self, body: dict, *, session_id: str, affinity: str | None = None) -> UpstreamReply:
        raise AssertionError


def test_the_probe_prefix_is_kept_per_engine_and_request() -> None:
    table, one, two = EngineFactsTable(), _Engine(), _Engine()
    request = {"model": "m", "messages": [{"role": "user", "content": "."}], "tools": [{"x": 1}]}
    table.of(one).keep_probe_prefix(request, [9, 10], [1, 2, 9, 10])
    assert table.of(one).probe_prefix(dict(reversed(list(request.items()))), [9, 10]) == [1, 2, 9, 10]
    assert table.of(two).probe_prefix(request, [9, 10]) is None  # another engine
    assert table.of(one).probe_prefix({**request, "tools": [{"x": 2}]}, [9, 10]) is None  # another rendering
    assert table.of(one).probe_prefix(request, [9]) is None  # re-certified turn end
    assert EngineFactsTable().of(one).probe_prefix(request, [9, 10]) is None  # another recorder's facts


def test_an_engine_that_needs_the_tool_list_in_its_probe_is_remembered_alone() -> None:
    table, one, two = EngineFactsTable(), _Engine(), _Engine()
    assert not table.of(one).probe_needs_tools
    table.of(one).probe_needs_tools = True
    assert table.of(one).probe_needs_tools and not table.of(two).probe_needs_tools


def test_a_suffix_is_certified_only_as_the_full_renders_tail_after_a_turn_end() -> None:
    from openenv_harness.recorder.prompt_modes.rendering import certified

    end = [9, 10]
    full = [1, 2, 9, 10, 3, 4, 9, 10, 5, 6]      # ... the last assistant turn's end, then the new messages
    assert certified(full, [5, 6], end)
    assert not certified(full, [5, 7], end)      # not the tail
    assert not certified(full, [6], end)         # the tail, but starting mid-turn: a shorter rendering
    assert not certified(full, [], end)          # nothing rendered for the new messages
    assert not certified([10, 5, 6], [5, 6], end)  # no room for the turn end before it


def test_the_probe_cut_finds_the_turn_end_where_the_template_rerendered_the_turn() -> None:
    from openenv_harness.recorder.prompt_modes.rendering import probe_cut

    end = [9, 10]
    prefix = [1, 9, 10, 2, 7, 7, 9, 10]          # user turn, assistant turn with a think block (7 7)
    assert probe_cut(prefix, prefix + [3, 9, 10, 4], end) == len(prefix)
    dropped = [1, 9, 10, 2, 9, 10, 3, 9, 10, 4]  # the think block dropped once a tool result follows
    assert probe_cut(prefix, dropped, end) == 6
    assert probe_cut(prefix, [1, 9, 10, 2, 3, 4], end) is None  # no turn end after the change
    # a change before the probe's assistant turn: the turn end found first is another turn's
    assert probe_cut([1, 9, 10, 2, 9, 10], [5, 9, 10, 2, 9, 10, 3], end) is None


def test_an_engines_ids_are_read_as_ints_or_fall_back() -> None:
    import pytest

    from openenv_harness.recorder.prompt_modes.rendering import id_array
    from openenv_harness.recorder.prompt_modes.state import Fallback

    assert id_array([3, 0, 2**32 - 1, True], "/r").tolist() == [3, 0, 2**32 - 1, 1]  # as int() reads a JSON true
    assert all(type(t) is int for t in id_array([True, False], "/r").tolist())
    for bad in ([1, 2.5], [1, "7"], [-1], [2**32], None, "12", [[1]]):
        with pytest.raises(Fallback) as caught:
            id_array(bad, "/r")
        assert caught.value.reason == "render_failed"
