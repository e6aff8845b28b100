"""A tracker whose tips were sketched (the recorder's budget needed the room) classifies every call
exactly as one that kept them whole: same class, parent and divergence position, reading a tip's
prompt back only for a break that parts inside one of its blocks."""

from __future__ import annotations

import random
from array import array
from pathlib import Path

from openenv_harness.recorder.chain.fidelity import FidelityTracker
from openenv_harness.recorder.chain.prefix import BLOCK
from openenv_harness.recorder.session.restore import read_tip_prompts
from openenv_harness.recorder.store import PendingRecord, SQLiteStore
from openenv_harness.recorder.upstream.span_budget import SpanBudget


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(60000) for _ in range(n)]


def _script(seed: int, steps: int) -> list[tuple[list[int], list[int]]]:
    """Calls of a session: chains that continue exactly or drift, breaks at any position, a
    sub-agent that starts over and comes back, retries of the same prompt."""
    rng = random.Random(seed)
    calls: list[tuple[list[int], list[int]]] = []
    heads = [_ids(rng, rng.randrange(1, 4 * BLOCK))]
    for _ in range(steps):
        kind = rng.random()
        prompt = list(rng.choice(heads))
        last = calls[-1] if calls else None
        if last and kind < 0.45:  # continue the latest call exactly
            prompt = last[0] + last[1] + _ids(rng, rng.randrange(0, 300))
        elif last and kind < 0.6:  # the answer came back re-tokenized
            prompt = last[0] + last[1][: rng.randrange(len(last[1]) + 1)] + _ids(rng, rng.randrange(1, 200))
        elif last and kind < 0.8:  # a break anywhere in an earlier prompt
            base = rng.choice(calls)[0]
            prompt = base[: rng.randrange(len(base) + 1)] + _ids(rng, rng.randrange(1, 400))
        elif last and kind < 0.85:  # the same prompt again
            prompt = list(last[0])
        else:  # a sub-agent (or the main chain again, from its head)
            if rng.random() < 0.5:
                heads.append(_ids(rng, rng.randrange(1, 3 * BLOCK)))
        calls.append((prompt, _ids(rng, rng.randrange(1, 120))))
    return calls


def test_sketched_tips_classify_every_call_as_whole_ones() -> None:
    total_reads = 0
    for seed in range(12):
        whole, sketched = FidelityTracker(), FidelityTracker()
        prompts: dict[str, bytes] = {}
        reads = breaks = 0
        for i, (prompt, completion) in enumerate(_script(seed, 60)):
            node = f"s/{i}"
            p, c = array("I", prompt), array("I", completion)
            need = sketched.prompts_needed(p)
            reads += len(need)
            expected = whole.observe(node, p, c)
            got = sketched.observe(node, p, c, {n: prompts[n] for n in need})
            assert got == expected, (seed, i, got, expected)
            if expected.fidelity != "break":
                assert need == {}, "a call continuing a chain reads nothing back"
            breaks += expected.fidelity == "break"
            prompts[node] = p.tobytes()
            sketched.placed(node, i + 1)
            sketched.drop_spans()  # the budget took the room after every call
            assert sketched.held_bytes() == 0
        assert reads <= 4 * breaks
        total_reads += reads
    assert total_reads > 0, "the script has breaks inside blocks: the read-back path ran"


def test_a_sketched_tip_holds_a_small_fraction_of_its_prompt() -> None:
    t = FidelityTracker()
    t.observe("s/0", array("I", range(65536)), array("I", range(100)))
    t.placed("s/0", 1)
    t.drop_spans()
    (tip,) = t.tips
    assert tip.prompt is None and tip.sketch is not None and tip.sketch.nbytes() * 60 < 65536 * 4


def test_a_tip_not_stored_yet_keeps_its_prompt() -> None:
    t = FidelityTracker()
    t.observe("s/0", array("I", range(1000)), array("I", [1]))
    t.drop_spans()
    assert t.held_bytes() == 4000, "no record to read it back from yet"


def test_the_budget_sketches_the_least_recently_calling_sessions_tips() -> None:
    budget = SpanBudget(limit_bytes=6000)
    old, new = FidelityTracker(budget=budget), FidelityTracker(budget=budget)
    old.observe("a/0", array("I", range(1000)), array("I", [1]))
    old.placed("a/0", 1)
    new.observe("b/0", array("I", range(1000)), array("I", [1]))
    assert old.held_bytes() == 0 and new.held_bytes() == 4000


async def test_tip_prompts_are_read_back_from_their_records(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "r.db")
    store.open()
    try:
        prompts = [array("I", range(i * 100, i * 100 + 3000 + i)) for i in range(4)]
        for i, prompt in enumerate(prompts):
            await store.append(PendingRecord(
                session_id="s", call_index=i, call_kind="agent", status="ok", request={"messages": []},
                response={}, prompt_ids=prompt, completion_ids=array("I", [1]), logprobs=array("d", [0.0]),
                completion_tokens=None, trainable=True, metadata={"node_id": f"s/{i}"}, created_at=1.0))
        got = await read_tip_prompts(store, "s", {"s/2": 3, "s/0": 1, "s/9": 4})
        assert got == {"s/2": prompts[2].tobytes(), "s/0": prompts[0].tobytes()}, "a seq of another node is no match"
    finally:
        store.close()


def test_sessions_whose_tips_are_sketched_between_calls_are_recorded_the_same(tmp_path: Path) -> None:
    """A recorder with no room for recent prompts: every call finds its session's tips sketched and
    its reader empty (other sessions called meanwhile), and records the same ids and classes."""
    from concurrent.futures import ThreadPoolExecutor

    from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
    from openenv_harness.testing.engine import EngineServer

    from agentloop import ADMIN, run_agent, tool_script

    with EngineServer() as engine:
        config = RecorderConfig(store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN,
                                prompt_cache_mb=0)
        with RecorderServer(config) as server, RecorderClient(server.url, ADMIN) as admin:
            sessions = [admin.create_session() for _ in range(4)]
            for s in sessions:
                engine.set_script(s["session_id"], tool_script(9))
            with ThreadPoolExecutor(max_workers=4) as pool:
                list(pool.map(lambda s: run_agent(s["base_url"], s["secret"], stream=False), sessions))
            for s in sessions:
                records = admin.records(s["session_id"])
                assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root"] + ["exact"] * 9
                assert [r["prompt_token_ids"] for r in records] == \
                    [e["sampled"]["prompt_token_ids"] for e in engine.requests(s["session_id"])]
