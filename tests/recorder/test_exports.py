"""Streamed record reads: the same bytes the whole-body routes sent, from one record at a time."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

from openenv_harness.contract import is_training_entry, training_trace_dict
from openenv_harness.recorder import exports
from openenv_harness.recorder.store import SQLiteStore
from openenv_harness.recorder.store import sqlite as store_sqlite

from store.test_sqlite import _conversation, _rec


async def _body(response) -> bytes:
    return b"".join([chunk async for chunk in response.body_iterator])


@pytest.mark.parametrize("page, bases", [(16, 8), (3, 1)])
async def test_streamed_reads_are_the_whole_reads_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        page: int, bases: int) -> None:
    # small pages and a one-record base memo: bases dropped early are walked back to, still exactly
    monkeypatch.setattr(store_sqlite, "_STREAM_PAGE", page)
    monkeypatch.setattr(store_sqlite, "_STREAM_BASES", bases)
    monkeypatch.setattr(exports, "CHUNK_BYTES", 4096)
    store = SQLiteStore(tmp_path / "r.db")
    store.open()
    try:
        rng = random.Random(5)
        for session in ("a", "b"):  # interleaved sessions: bases are not simply the previous seq
            for t, prompt, completion, messages in _conversation(11, 300, rng):
                rec = _rec(session, t, prompt, completion, messages)
                if t == 4:
                    rec.call_kind = rec.metadata["call_kind"] = "aux"
                if t == 2:  # under a decoding constraint: its logprobs are not the policy's
                    rec.metadata["logprobs_are_policy"] = False
                if t == 6:
                    rec.status = rec.metadata["status"] = "failed"
                    rec.prompt_ids = rec.completion_ids = rec.logprobs = None
                await store.append(rec)
        whole = await store.read_records("a")
        assert len(whole) == 11
        for include in ("all", "tokens", "training"):
            keep = [e for e in whole if exports.FILTERS[include](e)]
            got = await _body(await exports.records_response(store, "a", after_seq=0, include=include, jsonl=False))
            assert got == orjson.dumps(keep), include
            got = await _body(await exports.records_response(store, "a", after_seq=0, include=include, jsonl=True))
            assert got == b"".join(orjson.dumps(e) + b"\n" for e in keep), include
        later = whole[5]["metadata"]["seq"]
        got = await _body(await exports.records_response(store, "a", after_seq=later, include="all", jsonl=False))
        assert got == orjson.dumps(await store.read_records("a", after_seq=later))
        got = await _body(await exports.training_trace_response(store, "a"))
        assert orjson.loads(got) == training_trace_dict(whole)
        assert len(orjson.loads(got)["turns"]) == sum(map(is_training_entry, whole)) == 9
        constrained = next(t for t in orjson.loads(got)["turns"] if t["node_id"].endswith("/2"))
        assert not any(constrained["loss_mask"]), "post-mask logprobs are not offered as trainable"
        kept = orjson.loads(await _body(await exports.training_trace_response(store, "a", "keep")))
        assert kept == training_trace_dict(whole, "keep") != orjson.loads(got)
    finally:
        store.close()
