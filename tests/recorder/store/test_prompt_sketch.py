"""The indexer's delta bases are block digests: a chain still shares every id, a divergence loses at
most one block's sharing, every prompt reads back exactly, and what is held is a small fraction."""

from __future__ import annotations

import random
from array import array
from pathlib import Path

from openenv_harness.recorder.store import SQLiteStore, blocks
from openenv_harness.recorder.chain.prefix import DIGEST_BYTES
from openenv_harness.recorder.store.prompt_sketch import BLOCK, PromptSketch, block_digests, prompt_delta

from test_journal import _rec


def _bytes(ids: list[int]) -> bytes:
    return blocks.ids_to_bytes(array("I", ids))


def _sketch(seq: int, ids: list[int]) -> PromptSketch:
    data = _bytes(ids)
    return PromptSketch(seq, data, block_digests(data))


def test_a_prompt_that_extends_the_base_shares_all_of_it_to_the_id() -> None:
    base = list(range(5 * BLOCK + 37))  # ends inside a block
    new = base + [9, 8, 7]
    data = _bytes(new)
    assert prompt_delta([_sketch(4, base)], data, block_digests(data)) == (4, len(base), _bytes([9, 8, 7]))


def test_a_divergence_inside_the_partial_block_is_exact_and_inside_a_whole_block_stops_at_its_start() -> None:
    base = list(range(5 * BLOCK + 37))
    late = base[:5 * BLOCK + 20] + [99999] * 40
    data = _bytes(late)
    assert prompt_delta([_sketch(1, base)], data, block_digests(data))[:2] == (1, 5 * BLOCK + 20)
    early = base[:2 * BLOCK + 100] + [99999] * 3000
    data = _bytes(early)
    seq, shared, tail = prompt_delta([_sketch(1, base)], data, block_digests(data))
    assert (seq, shared) == (1, 2 * BLOCK), "the digests say block 2 differs; its first 100 ids are stored again"
    assert tail == data[shared * 4:]
    data = _bytes([5] * 600)
    assert prompt_delta([_sketch(1, base)], data, block_digests(data)) == (None, 0, data), "nothing shared"


def test_the_candidate_sharing_most_is_the_base() -> None:
    main = list(range(3 * BLOCK + 10))
    sub = main[:BLOCK] + [7] * 900
    new = sub + [1, 2]
    data = _bytes(new)
    assert prompt_delta([_sketch(1, main), _sketch(2, sub)], data, block_digests(data))[:2] == (2, len(sub))


def test_a_sketch_holds_a_small_fraction_of_its_prompt() -> None:
    ids = list(range(65536 + 100))
    sketch = _sketch(1, ids)
    assert sketch.nbytes() == 65536 // BLOCK * DIGEST_BYTES + 100 * 4  # 2 KB of digests + the partial block
    assert sketch.nbytes() * 50 < len(ids) * 4


async def test_prompts_with_divergences_anywhere_read_back_exactly(tmp_path: Path) -> None:
    rng = random.Random(5)
    store = SQLiteStore(tmp_path / "r.db")
    store.open()
    try:
        prompt = [rng.randrange(50000) for _ in range(3000)]
        expected = []
        for i in range(40):
            if i % 5 == 4:  # a drift or break somewhere in the history
                cut = rng.randrange(len(prompt))
                prompt = prompt[:cut] + [rng.randrange(50000) for _ in range(rng.randrange(1, 700))]
            else:
                prompt = prompt + [rng.randrange(50000) for _ in range(rng.randrange(0, 400))]
            rec = _rec(i)
            rec.prompt_ids = array("I", prompt)
            await store.append(rec)
            expected.append(list(prompt))
        got = await store.read_records("s")
        assert [e["prompt_token_ids"] for e in got] == expected
        await store.caught_up()
        held = sum(s.nbytes() for tail in store._index_ops._recent.values() for s in tail.prompts)
        assert held < 2 * (len(prompt) * 4 // 50 + BLOCK * 4), "two bases, each digests and a partial block"
        stored = store.session_bytes("s")["total"]
        assert stored < sum(len(p) for p in expected) * 4 // 4, "still stored as deltas"
    finally:
        store.close()
