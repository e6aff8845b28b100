"""Encodings the store shares: token arrays as bytes, content-addressed message blobs.

Every call of an agent's conversation repeats the whole history, so storing each call whole costs
O(turns^2). Prompts are therefore stored as "an earlier record's prompt up to N tokens + the new
tokens" (see ``deltas.py``), and messages are stored once each under the hash of their JSON, a
request keeping only the list of message hashes (itself delta-encoded against the previous record).
Reconstruction is exact: bytes in, the same bytes out.
"""

from __future__ import annotations

import hashlib
import sys
import threading
import zlib
from array import array
from collections.abc import Iterable
from typing import Any, Literal, overload

import orjson
import zstandard

HASH_BYTES = 16
#: Blobs at least this large are compressed (text compresses ~3-5x).
COMPRESS_MIN = 192
#: zstd level 1: zlib level 1's ratio or better on this data at about half its CPU (2 KB message:
#: 12 vs 18 us; 0.7 KB of metadata: 6 vs 12 us; 58 KB: 185 vs 357 us) -- zlib sets up a fresh 256 KB
#: state on every call, a reused zstd context does not (``docs/benchmarks.md``). The index process
#: compresses every new message and each record's request, reply and metadata.
ZSTD_LEVEL = 1

_LITTLE = sys.byteorder == "little"

# One-byte tags: 0x00 raw, 0x01 zlib (written by earlier versions; still read), 0x02 zstd.
_RAW = b"\x00"
_ZLIB = b"\x01"
_ZSTD = b"\x02"

def digest(data: bytes) -> bytes:
    """Content hash of a blob: sha256 truncated to 128 bits (hardware-accelerated on current CPUs;
    collisions are not a practical concern at this size)."""
    return hashlib.sha256(data).digest()[:HASH_BYTES]


def pack_blob(data: bytes) -> bytes:
    if len(data) >= COMPRESS_MIN:
        packed = _codec.compressor.compress(data)
        if len(packed) < len(data):
            return _ZSTD + packed
    return _RAW + data


def raw_blob(data: bytes) -> bytes:
    """Stored as is (tagged), for data that compression would only slow down."""
    return _RAW + data


def unpack_blob(stored: bytes) -> bytes:
    tag, body = stored[:1], stored[1:]
    if tag == _ZSTD:
        return _codec.decompressor.decompress(body)
    if tag == _RAW:
        return body
    if tag == _ZLIB:
        return zlib.decompress(body)
    raise ValueError(f"unknown blob tag {tag!r}")


class _ThreadCodec(threading.local):
    """zstd contexts, one pair per thread, made on the thread's first use: reused across blobs, their
    set-up being most of a small blob's cost, and not safe to share between threads."""

    def __init__(self) -> None:
        self.compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)  # frames carry their size
        self.decompressor = zstandard.ZstdDecompressor()


_codec = _ThreadCodec()


def ids_to_bytes(ids: array[int] | array[float]) -> bytes:
    """Little-endian uint32 bytes of a token array (the on-disk form)."""
    if _LITTLE:
        return ids.tobytes()
    swapped = array(ids.typecode, ids)
    swapped.byteswap()
    return swapped.tobytes()


@overload
def bytes_to_ids(data: bytes, typecode: Literal["I"] = ...) -> array[int]: ...
@overload
def bytes_to_ids(data: bytes, typecode: Literal["d"]) -> array[float]: ...


def bytes_to_ids(data: bytes, typecode: str = "I") -> array[int] | array[float]:
    out = array(typecode)
    out.frombytes(data)
    if not _LITTLE:
        out.byteswap()
    return out


def join_hashes(hashes: Iterable[bytes]) -> bytes:
    return b"".join(hashes)


def split_hashes(joined: bytes) -> list[bytes]:
    return [joined[i : i + HASH_BYTES] for i in range(0, len(joined), HASH_BYTES)]


def message_blobs(messages: list[Any]) -> list[tuple[bytes, bytes]]:
    """``(hash, json_bytes)`` per message; the JSON keeps the agent's key order.

    Every message is hashed again on every call rather than compared with a cached copy of the
    session's previous messages: hashing runs at over 1 GB/s, and the cache held ~600 KB per live
    session (measured: ~40 MB of the index process at 64 sessions of 8k prompts).
    """
    out = []
    for message in messages:
        data = orjson.dumps(message)
        out.append((digest(data), data))
    return out
