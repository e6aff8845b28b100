"""Common prefixes of token-id byte strings, and a prompt kept as block digests instead of its ids.

Why one module: two holders need "how much of this new prompt equals that earlier one" -- the
fidelity tracker (is a chain tip's prompt a prefix of this call's, and where do they part) and the
index process (how many ids a record shares with its delta base). Keeping the earlier prompts
whole would cost 4 bytes per id per session between calls. A ``PromptSketch`` keeps a SHA-256
digest per whole block of ``BLOCK`` ids and the ids of the last, partial block: about 1/128 of the
prompt plus at most one block. (SHA-256 on 4 KB blocks: the fastest of hashlib's digests on CPUs
with SHA extensions, ~0.5 ms for a 90k-id prompt here; BLAKE2b on 1 KB blocks took ~1.4 ms.) Against a new prompt (with its own ``block_digests``) it gives the common prefix
exactly whenever every whole block of the sketch matches -- which includes "the earlier prompt is
a prefix of the new one", the chain case -- and otherwise the start of the block where they part,
flagged as not exact: a caller needing the exact position there reads the prompt back.
"""

from __future__ import annotations

from hashlib import sha256

#: Ids per digested block (4 bytes each in a prompt's byte form).
BLOCK = 1024
BLOCK_BYTES = BLOCK * 4
DIGEST_BYTES = 32


def common_prefix_len(a: bytes, b: bytes) -> int:
    """Length of the common prefix of two byte strings.

    ``startswith`` settles the common case (one is a prefix of the other) without copying; otherwise
    a binary search compares only the *untested* part of each range, so the bytes copied add up to
    about ``len`` once rather than ``len * log(len)``.
    """
    short, long_ = (a, b) if len(a) <= len(b) else (b, a)
    if long_.startswith(short):
        return len(short)
    lo, hi = 0, len(short)  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def block_digests(prompt: bytes) -> bytes:
    """The digests of ``prompt``'s whole blocks, concatenated."""
    view = memoryview(prompt)
    whole = len(prompt) - len(prompt) % BLOCK_BYTES
    return b"".join(sha256(view[i : i + BLOCK_BYTES]).digest() for i in range(0, whole, BLOCK_BYTES))


class PromptSketch:
    """A prompt as its block digests and its partial last block (and its length)."""

    __slots__ = ("digests", "length", "seq", "tail")

    def __init__(self, seq: int | None, prompt: bytes, digests: bytes | None = None) -> None:
        self.seq = seq
        self.digests = block_digests(prompt) if digests is None else digests
        self.tail = prompt[len(self.digests) // DIGEST_BYTES * BLOCK_BYTES :]
        self.length = len(prompt)

    def common_prefix(self, prompt: bytes, digests: bytes) -> tuple[int, bool]:
        """``(bytes, exact)``: how much of ``prompt`` (with its ``block_digests``) is known to equal
        this prompt's start, and whether that is the exact common prefix. Not exact only when they
        part inside one of this prompt's whole blocks (the count is then that block's start)."""
        blocks = common_prefix_len(self.digests, digests) // DIGEST_BYTES
        if blocks * DIGEST_BYTES < len(self.digests):
            start = blocks * BLOCK_BYTES
            return start, start == len(prompt)
        start = blocks * BLOCK_BYTES
        return start + common_prefix_len(self.tail, prompt[start : start + len(self.tail)]), True

    def is_prefix_of(self, prompt: bytes, digests: bytes) -> bool:
        return len(prompt) >= self.length and self.common_prefix(prompt, digests)[0] == self.length

    def nbytes(self) -> int:
        return len(self.digests) + len(self.tail)
