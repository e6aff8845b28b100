"""Content-addressed storage of token arrays and chat messages: why storage grows linearly.

Every call of an agent's conversation repeats the whole history in its prompt, so storing each
prompt whole costs O(turns^2). Instead a prompt is cut into fixed-size blocks of token ids at
fixed offsets (0, B, 2B, ...): two prompts that share a token prefix share every full block of that
prefix, byte for byte, so each block is stored once under its hash and a record keeps only the
list of block hashes. The same goes for messages: each message is stored once under the hash of
its JSON and the request keeps the list of message hashes.

Reconstruction is exact (bytes in, same bytes out) and needs one indexed lookup per distinct block.
"""

from __future__ import annotations

import hashlib
import sys
import zlib
from array import array
from typing import Iterable

import orjson

BLOCK_TOKENS = 256
HASH_BYTES = 16
#: Blobs at least this large are zlib-compressed (text compresses ~3-5x; ids ~1.5-2x).
COMPRESS_MIN = 192

_LITTLE = sys.byteorder == "little"

# One-byte tags: 0x00 raw, 0x01 zlib.
_RAW = b"\x00"
_ZLIB = b"\x01"


def digest(data: bytes) -> bytes:
    """Content hash of a blob (blake2b-128: fast, and collisions are not a practical concern)."""
    return hashlib.blake2b(data, digest_size=HASH_BYTES).digest()


def pack_blob(data: bytes) -> bytes:
    if len(data) >= COMPRESS_MIN:
        packed = zlib.compress(data, 1)
        if len(packed) < len(data):
            return _ZLIB + packed
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


def split_blocks(ids_bytes: bytes) -> list[tuple[bytes, bytes]]:
    """Cut little-endian id bytes into ``(hash, block_bytes)`` pairs at fixed offsets."""
    step = BLOCK_TOKENS * 4
    return [
        (digest(ids_bytes[i : i + step]), ids_bytes[i : i + step])
        for i in range(0, len(ids_bytes), step)
    ]


def join_hashes(hashes: Iterable[bytes]) -> bytes:
    return b"".join(hashes)


def split_hashes(joined: bytes) -> list[bytes]:
    return [joined[i : i + HASH_BYTES] for i in range(0, len(joined), HASH_BYTES)]


def message_blobs(messages: list) -> list[tuple[bytes, bytes]]:
    """``(hash, json_bytes)`` per message; the JSON keeps the agent's key order."""
    out = []
    for message in messages:
        data = orjson.dumps(message)
        out.append((digest(data), data))
    return out
