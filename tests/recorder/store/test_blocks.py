"""Stored blob encodings: what is written is read back byte for byte, whichever codec wrote it."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import zlib
from pathlib import Path

import orjson
import pytest

from openenv_harness.recorder.store import SQLiteStore, blocks

from test_journal import _rec


def test_blobs_round_trip_and_only_compressible_ones_are_compressed() -> None:
    text = orjson.dumps({"role": "user", "content": "fix the failing test in src/add.py " * 40})
    packed = blocks.pack_blob(text)
    assert packed[:1] == b"\x02" and len(packed) < len(text) / 3  # zstd, and it pays
    assert blocks.unpack_blob(packed) == text
    small = b'{"role":"user","content":"hi"}'
    assert blocks.pack_blob(small) == b"\x00" + small  # below COMPRESS_MIN: as is
    noise = os.urandom(4096)
    assert blocks.pack_blob(noise) == b"\x00" + noise  # compression would not shrink it
    assert blocks.unpack_blob(blocks.pack_blob(noise)) == noise


def test_zlib_blobs_written_by_earlier_versions_are_still_read() -> None:
    text = b"an older store's message " * 50
    assert blocks.unpack_blob(b"\x01" + zlib.compress(text, 1)) == text


def test_a_blob_with_an_unknown_tag_or_a_damaged_body_is_an_error_not_wrong_bytes() -> None:
    with pytest.raises(ValueError, match="unknown blob tag"):
        blocks.unpack_blob(b"\x07abc")
    packed = blocks.pack_blob(b"some message text " * 40)
    with pytest.raises(Exception):
        blocks.unpack_blob(packed[:-5])


def test_threads_compress_independently_and_correctly() -> None:
    texts = [(f"thread {n} " * 200).encode() for n in range(4)]
    results: dict[int, list[bool]] = {}

    def work(n: int) -> None:
        results[n] = [blocks.unpack_blob(blocks.pack_blob(texts[n] + str(i).encode())) == texts[n] + str(i).encode()
                      for i in range(300)]

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(all(ok) for ok in results.values()) and len(results) == 4


def test_a_store_with_zlib_blobs_from_an_earlier_version_reads_back_the_same_records(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "r.db", indexer="thread")
    store.open()

    async def fill() -> list[dict]:
        for i in range(3):
            rec = _rec(i)
            rec.request["messages"].append({"role": "tool", "content": f"output of call {i}: " + "ok " * 200})
            rec.response["choices"][0]["message"]["content"] = "a long enough answer " * 20
            await store.append(rec)
        await store.caught_up()
        return await store.read_records("s")

    before = asyncio.run(fill())
    store.close()
    # rewrite every zstd blob as the zlib blob an earlier version would have stored
    conn = sqlite3.connect(tmp_path / "r.db")
    for table, key, columns in (("blobs", "hash", ("data",)), ("records", "seq", ("request", "response", "metadata"))):
        for row in conn.execute(f"SELECT {key}, {', '.join(columns)} FROM {table}").fetchall():
            values = [b"\x01" + zlib.compress(blocks.unpack_blob(v), 1) if v[:1] == b"\x02" else v for v in row[1:]]
            conn.execute(f"UPDATE {table} SET {', '.join(c + '=?' for c in columns)} WHERE {key}=?", (*values, row[0]))
    assert conn.execute("SELECT count(*) FROM blobs WHERE substr(data, 1, 1) = x'01'").fetchone()[0] == 3
    assert conn.execute("SELECT count(*) FROM records WHERE substr(response, 1, 1) = x'01'").fetchone()[0] == 3
    conn.commit()
    conn.close()
    again = SQLiteStore(tmp_path / "r.db", indexer="thread")
    again.open()
    try:
        assert asyncio.run(again.read_records("s")) == before
    finally:
        again.close()
