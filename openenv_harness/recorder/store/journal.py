"""The store's durability point: an append-only file of framed records, written before the reply.

Why it exists: a record must be durable before the agent hears its reply (D14), but committing a
SQLite transaction on that path costs more than the rest of the recorder's work on a call
(measured in ``benchmarks/``: 0.5-0.7 ms of commit plus two thread hand-offs at 8k-token
prompts, and the tail of every WAL checkpoint). A ``write(2)`` to an append-only file is durable
against the process being killed the moment it returns -- the page belongs to the kernel -- which
is the same guarantee SQLite gives in WAL mode with ``synchronous=NORMAL``. With
``synchronous=FULL`` the file is also ``fsync``-ed before the call returns.

So the hot path writes one frame here and moves on; the store's writer thread then indexes the
record into SQLite in batches, and the segments it has committed are deleted. On start-up every
frame that SQLite does not have yet is indexed before the recorder serves (``SQLiteStore.open``).

Frame: ``"OEHJ" | seq u64 | length u32 | payload | "JEHO"`` (little-endian). A frame is taken
only whole: a kill mid-write leaves a short tail, which ``recover`` drops -- that record was never
acknowledged. Segments are named by their first sequence number and rotate past a size.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import struct
import threading
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from openenv_harness.recorder.store.base import PendingRecord, SessionRow

_MAGIC = b"OEHJ"
_TRAILER = b"JEHO"
_HEAD = struct.Struct("<4sQI")
_PARTS = struct.Struct("<Iiiii")  # head json, request json, prompt, completion, logprobs (-1: none)
#: A session row's payload starts with this; a record's starts with its head's length, which would
#: have to be over a gigabyte to read the same.
_SESSION_TAG = b"OEHSESSION\x00"
#: Segments rotate past this size, and only a closed segment is deleted (once all its records are
#: indexed): so the journal on disk is about one segment plus the indexer's backlog. Each frame holds
#: a whole prompt (SQLite keeps only its new ids), so a 64 MB segment was many times the bytes the
#: same records take once indexed; a segment a second or two of calls long keeps that small.
SEGMENT_BYTES = 4 << 20


def journal_directory(db_path: str) -> str:
    """Where the journal of the store at ``db_path`` keeps its segments: beside the database, so the
    recorder and its index process find it from the one path they share."""
    return db_path + ".records-log"


@dataclass
class _Segment:
    path: Path
    first_seq: int
    last_seq: int = 0  # 0: no frame yet


class JournalError(RuntimeError):
    """The journal could not take a record (disk full, closed): the call must fail, not be acked."""


class Journal:
    """Segment files under ``directory``; ``append`` is called with the store's append lock held."""

    def __init__(self, directory: str | Path, *, fsync: bool = False, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = Path(directory)
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._closed_segments: list[_Segment] = []
        self._current: _Segment | None = None
        self._fd = -1
        self._size = 0
        self._lock_fd = -1

    # -- start-up --------------------------------------------------------------------------------

    def acquire(self) -> None:
        """Take the journal for this process, before reading it: ``start`` deletes the segments it
        recovered, so a second recorder opening the same store would delete the first one's."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise JournalError(f"the store's record journal {self.directory} is in use by another recorder "
                               f"(pid {holder}); give each recorder its own store") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd

    def _release_lock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = -1

    def segments(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(self.directory.glob("records-*.log"))

    def recover(self) -> Iterator[tuple[int, bytes]]:
        """Every whole frame of every segment, oldest first. A torn tail ends that segment."""
        for path in self.segments():
            data = path.read_bytes()
            offset = 0
            while offset + _HEAD.size <= len(data):
                magic, seq, length = _HEAD.unpack_from(data, offset)
                end = offset + _HEAD.size + length
                if magic != _MAGIC or end + len(_TRAILER) > len(data) or data[end : end + len(_TRAILER)] != _TRAILER:
                    break
                yield seq, data[offset + _HEAD.size : end]
                offset = end + len(_TRAILER)

    def start(self, next_seq: int) -> None:
        """Drop the recovered segments (their frames are indexed now) and open a fresh one."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in self.segments():
            path.unlink()
        self._open_segment(next_seq)

    def _segment_path(self, first_seq: int) -> Path:
        return self.directory / f"records-{first_seq:020d}.log"

    def _open_segment(self, first_seq: int) -> None:
        path = self._segment_path(first_seq)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._current = _Segment(path, first_seq)
        self._size = 0

    # -- the hot path ------------------------------------------------------------------------------

    def append(self, seq: int, parts: list[bytes]) -> tuple[int, int, int]:
        """Write one frame; returns once it is durable (see the module docstring), with where its
        payload lies: ``(segment's first seq, offset, length)`` for ``read_payload``."""
        length = sum(len(p) for p in parts)
        frame = [_HEAD.pack(_MAGIC, seq, length), *parts, _TRAILER]
        with self._lock:
            if self._current is None:
                raise JournalError("the record journal is closed")
            if self._size >= self.segment_bytes and self._current.last_seq:
                self._rotate(seq)
            start = self._size
            try:
                _write_all(self._fd, frame)
                if self.fsync:
                    os.fsync(self._fd)
            except OSError as exc:
                with contextlib.suppress(OSError):  # leave no partial frame for the next one to follow
                    os.ftruncate(self._fd, start)
                raise JournalError(f"cannot write the record journal: {exc}") from exc
            self._size = start + _HEAD.size + length + len(_TRAILER)
            self._current.last_seq = seq
            return self._current.first_seq, start + _HEAD.size, length

    def read_payload(self, where: tuple[int, int, int]) -> bytes:
        """A frame's payload by ``append``'s answer; segments go only once their records are indexed."""
        first_seq, offset, length = where
        fd = os.open(self._segment_path(first_seq), os.O_RDONLY)
        try:
            data = os.pread(fd, length, offset)
        finally:
            os.close(fd)
        if len(data) != length:
            raise ValueError(f"journal segment {first_seq} ends {length - len(data)} bytes short of the frame")
        return data

    def _rotate(self, next_seq: int) -> None:
        assert self._current is not None
        os.close(self._fd)
        self._closed_segments.append(self._current)
        self._open_segment(next_seq)

    # -- after indexing ----------------------------------------------------------------------------

    def release(self, indexed_through: int) -> None:
        """Delete closed segments whose every record is committed in SQLite."""
        with self._lock:
            done = [s for s in self._closed_segments if s.last_seq <= indexed_through]
            self._closed_segments = [s for s in self._closed_segments if s.last_seq > indexed_through]
        for segment in done:  # outside the lock: freeing a large file takes a while
            segment.path.unlink(missing_ok=True)

    def close(self, *, remove: bool) -> None:
        """Close the open segment; ``remove`` deletes every segment (all of them are indexed)."""
        with self._lock:
            if self._current is None:
                self._release_lock()
                return
            os.close(self._fd)
            self._fd = -1
            segments = [*self._closed_segments, self._current]
            self._current = None
            self._closed_segments = []
            if remove:
                for segment in segments:
                    segment.path.unlink(missing_ok=True)
            self._release_lock()


def _write_all(fd: int, parts: list[bytes]) -> None:
    written = os.writev(fd, parts)
    total = sum(len(p) for p in parts)
    if written == total:
        return
    rest = b"".join(parts)[written:]  # a short write (rare on regular files): finish it
    while rest:
        rest = rest[os.write(fd, rest):]


# -- what a frame holds -------------------------------------------------------------------------


def encode_record(rec: PendingRecord) -> list[bytes]:
    """A record as byte strings to write back to back: no copy of the token arrays' buffers."""
    head = orjson.dumps({
        "session_id": rec.session_id, "call_index": rec.call_index, "call_kind": rec.call_kind,
        "status": rec.status, "trainable": rec.trainable, "created_at": rec.created_at,
        "response": rec.response, "metadata": rec.metadata, "completion_tokens": rec.completion_tokens,
    })
    request = rec.request_json if rec.request_json is not None else orjson.dumps(rec.request)
    arrays = [_raw(rec.prompt_ids), _raw(rec.completion_ids), _raw(rec.logprobs)]
    sizes = [len(a) if a is not None else -1 for a in arrays]
    return [_PARTS.pack(len(head), len(request), *sizes), head, request, *(a for a in arrays if a)]


def decode_record(payload: bytes) -> PendingRecord:
    head_len, request_len, *sizes = _PARTS.unpack_from(payload, 0)
    offset = _PARTS.size
    head = orjson.loads(payload[offset : offset + head_len])
    offset += head_len
    request_json = payload[offset : offset + request_len]
    offset += request_len
    arrays: list[array[Any] | None] = []  # prompt ids, completion ids, logprobs
    for size, typecode in zip(sizes, ("I", "I", "d"), strict=True):
        if size < 0:
            arrays.append(None)
            continue
        values = array(typecode)
        values.frombytes(payload[offset : offset + size])
        offset += size
        arrays.append(values)
    if offset != len(payload):
        raise ValueError(f"journal frame has {len(payload) - offset} unexplained trailing bytes")
    return PendingRecord(
        session_id=head["session_id"], call_index=head["call_index"], call_kind=head["call_kind"],
        status=head["status"], request=orjson.loads(request_json), response=head["response"],
        prompt_ids=arrays[0], completion_ids=arrays[1], logprobs=arrays[2],
        completion_tokens=head["completion_tokens"], trainable=head["trainable"], metadata=head["metadata"],
        created_at=head["created_at"], request_json=request_json,
    )


def encode_session(row: SessionRow) -> list[bytes]:
    """A session row as a frame's payload: sessions are journalled like records (``SQLiteStore.put_session``)."""
    return [_SESSION_TAG, orjson.dumps(dataclasses.asdict(row))]


def decode_session(payload: bytes) -> SessionRow | None:
    """The session row a payload holds, or None when it holds a record."""
    if not payload.startswith(_SESSION_TAG):
        return None
    return SessionRow(**orjson.loads(payload[len(_SESSION_TAG):]))


def _raw(values: array[int] | array[float] | None) -> bytes | None:
    """Native-order bytes: a journal is read back by the machine that wrote it."""
    return values.tobytes() if values is not None else None
