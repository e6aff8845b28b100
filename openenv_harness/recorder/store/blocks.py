"""Encodings the store shares: token arrays as bytes, content-addressed message blobs.

Every call of an agent's conversation repeats the whole history, so storing each call whole costs
O(turns^2). Prompts are therefore stored as "an earlier record's prompt up to N tokens + the new
tokens" (see ``sqlite.py``), and messages are stored once each under the hash of their JSON, a
request keeping only the list of message hashes (itself delta-encoded against the previous record).
Reconstruction is exact: bytes in, the same bytes out.
"""

from __future__ import annotations

import hashlib
import sys
import zlib
from array import array
from typing import Iterable

import orjson

HASH_BYTES = 16
#: Blobs at least this large are zlib-compressed (text compresses ~3-5x; ids ~1.5-2x).
COMPRESS_MIN = 192

_LITTLE = sys.byteorder == "little"

# One-byte tags: 0x00 raw, 0x01 zlib.
_RAW = b"\x00"
_ZLIB = b"\x01"


def digest(data: bytes) -> bytes:
    """Content hash of a blob: sha256 truncated to 128 bits (hardware-accelerated on current CPUs;
    collisions are not a practical concern at this size)."""
    return hashlib.sha256(data).digest()[:HASH_BYTES]


def pack_blob(data: bytes) -> bytes:
    if len(data) >= COMPRESS_MIN:
        packed = zlib.compress(data, 1)
        if len(packed) < len(data):
            return _ZLIB + packed
    return _RAW + data


def raw_blob(data: bytes) -> bytes:
    """Stored as is (tagged), for data that compression would only slow down."""
    return _RAW + data


def unpack_blob(stored: bytes) -> bytes:
    tag, body = stored[:1], stored[1:]
    if tag == _ZLIB:
        return zlib.decompress(body)
    if tag == _RAW:
        return body
    raise ValueError(f"unknown blob tag {tag!r}")


def ids_to_bytes(ids: array) -> bytes:
    """Little-endian uint32 bytes of a token array (the on-disk form)."""
    if _LITTLE:
        return ids.tobytes()
    swapped = array(ids.typecode, ids)
    swapped.byteswap()
    return swapped.tobytes()


def bytes_to_ids(data: bytes, typecode: str = "I") -> array:
    out = array(typecode)
    out.frombytes(data)
    if not _LITTLE:
        out.byteswap()
    return out


def join_hashes(hashes: Iterable[bytes]) -> bytes:
    return b"".join(hashes)


def split_hashes(joined: bytes) -> list[bytes]:
    return [joined[i : i + HASH_BYTES] for i in range(0, len(joined), HASH_BYTES)]


def message_blobs(messages: list) -> list[tuple[bytes, bytes]]:
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
