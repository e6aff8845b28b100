"""The prompt spans every session's reader remembers live under one budget: past it the sessions
that called least recently forget theirs, and read the same ids by parsing the whole span."""

from __future__ import annotations

import gc

from openenv_harness.recorder.upstream.reply_parse import PromptIdsReader, read_ids
from openenv_harness.recorder.upstream.span_budget import SpanBudget


def _span(ids: list[int]) -> bytes:
    return ",".join(map(str, ids)).encode()


def test_past_the_budget_the_least_recent_session_forgets_its_spans_and_reads_the_same_ids() -> None:
    first = [1000 + i for i in range(3000)]
    one_span = len(_span(first)) + 4 * len(first)
    budget = SpanBudget(limit_bytes=int(one_span * 2.5))  # two sessions' spans fit, not three
    readers = [PromptIdsReader(budget) for _ in range(3)]
    for reader in readers[:2]:
        assert reader.read(_span(first)).tolist() == first
    assert budget.total_bytes == 2 * one_span and all(r.held_bytes() for r in readers[:2])
    readers[2].read(_span(first))
    assert readers[0].held_bytes() == 0, "the least recently used session's spans went"
    assert readers[1].held_bytes() and readers[2].held_bytes()
    assert budget.total_bytes <= budget.limit_bytes and len(budget) == 2

    longer = first + [7, 8, 9]
    assert readers[0].read(_span(longer)) == read_ids(_span(longer)), "parsed whole: the same ids"
    assert readers[1].held_bytes() == 0, "now the least recent one"
    assert readers[2].read(_span(first + [5])).tolist() == first + [5], "a kept span is extended as before"


def test_a_reader_that_goes_gives_its_bytes_back() -> None:
    budget = SpanBudget(limit_bytes=1 << 20)
    reader = PromptIdsReader(budget)
    reader.read(_span(list(range(500))))
    assert budget.total_bytes > 0
    del reader
    gc.collect()
    assert budget.total_bytes == 0 and len(budget) == 0


def test_a_reader_without_a_budget_keeps_its_spans() -> None:
    reader = PromptIdsReader()
    reader.read(_span(list(range(500))))
    assert reader.held_bytes() == len(_span(list(range(500)))) + 2000
