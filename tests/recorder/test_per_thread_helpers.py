"""The recorder's stateful fast helpers -- the reply parser's simdjson parser, the store's zstd
contexts -- are one per thread: reused within a thread (their buffers are most of their speed) and
never shared between threads (they are not thread-safe)."""

from __future__ import annotations

import threading
from typing import Any

from openenv_harness.recorder.store import blocks
from openenv_harness.recorder.upstream import reply_parse


def _per_thread(get: Any) -> tuple[object, list[object]]:
    mine = get()
    theirs: list[object] = []
    workers = [threading.Thread(target=lambda: theirs.extend([get(), get()])) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return mine, theirs


def test_each_thread_has_its_own_parser_and_codec_reused_within_it() -> None:
    for get in (lambda: reply_parse._thread.parser, lambda: blocks._codec.compressor,
                lambda: blocks._codec.decompressor):
        mine, theirs = _per_thread(get)
        assert get() is mine
        assert all(theirs[i] is theirs[i + 1] for i in range(0, 6, 2))  # reused within a thread
        assert len({id(x) for x in theirs} | {id(mine)}) == 4  # one here, one per worker thread


def test_the_helpers_work_on_another_thread() -> None:
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.extend([reply_parse.read_ids(b"1,2,3"),
                                                         blocks.unpack_blob(blocks.pack_blob(b"x" * 5000))]))
    worker.start()
    worker.join()
    assert list(out[0]) == [1, 2, 3] and out[1] == b"x" * 5000
