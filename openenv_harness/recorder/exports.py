"""A session's records as a streamed HTTP body: the admin API's record and training-trace reads.

Why streamed: a long session's records are tens of megabytes of JSON, and built whole they were
several times that in Python objects at once (every prompt a list of ints), which the process did
not give back after the read (resident memory stayed 30-65 MB above its level). Streamed, one
record is decoded, encoded and let go at a time (``RecordStore.iter_records``), and what the
client receives is byte for byte what the whole-body route sent.

The body is produced on a worker thread (Starlette runs a synchronous iterator in its thread
pool), in chunks of about ``CHUNK_BYTES`` so a large read costs few thread hand-offs. Its status
is decided before the first byte: a store that fails half-way through a read ends the body early
(the client sees invalid JSON), where a whole read would have answered 500.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import orjson
from starlette.responses import StreamingResponse

from openenv_harness.contract import is_training_entry, training_turn
from openenv_harness.recorder.store.base import RecordStore

CHUNK_BYTES = 1 << 20

#: ``include=`` of the records route: which entries it keeps
FILTERS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "all": lambda e: True,
    "tokens": lambda e: e["metadata"].get("status") != "failed",
    "training": is_training_entry,
}


def _chunked(parts: Iterable[bytes]) -> Iterator[bytes]:
    buffer: list[bytes] = []
    size = 0
    for part in parts:
        buffer.append(part)
        size += len(part)
        if size >= CHUNK_BYTES:
            yield b"".join(buffer)
            buffer, size = [], 0
    if buffer:
        yield b"".join(buffer)


def _array(items: Iterable[Any], head: bytes = b"[", tail: bytes = b"]") -> Iterator[bytes]:
    yield head
    for i, item in enumerate(items):
        yield (b"," if i else b"") + orjson.dumps(item)
    yield tail


async def records_response(store: RecordStore, session_id: str, *, after_seq: int, include: str,
                           jsonl: bool) -> StreamingResponse:
    """What ``GET /admin/sessions/{id}/records`` answers: a JSON array, or one entry per line."""
    await store.caught_up()
    keep = FILTERS[include]
    entries = (e for e in store.iter_records(session_id, after_seq=after_seq) if keep(e))
    if jsonl:
        return StreamingResponse(_chunked(orjson.dumps(e) + b"\n" for e in entries), media_type="application/x-ndjson")
    return StreamingResponse(_chunked(_array(entries)), media_type="application/json")


async def training_trace_response(store: RecordStore, session_id: str, non_policy: str = "mask") -> StreamingResponse:
    """What ``GET /admin/sessions/{id}/training_trace`` answers: ``contract.training_trace_dict``'s JSON
    (sampled ids whose logprobs are not the policy's are mask 0 unless ``non_policy="keep"``)."""
    await store.caught_up()
    turns = (training_turn(e, non_policy) for e in store.iter_records(session_id) if is_training_entry(e))
    return StreamingResponse(_chunked(_array(turns, b'{"schema_version":1,"turns":[', b"]}")),
                             media_type="application/json")
