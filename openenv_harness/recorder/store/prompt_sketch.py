"""What the indexer keeps of a session's latest prompts to delta the next one: block digests, not ids.

Why: a record stores its prompt as (an earlier record, how many ids the two share, the new ids), so
the indexer keeps each session's latest prompts as candidate bases. Kept as ids, that was 4 bytes
per id per base for each of up to 512 sessions -- 256 KB a base at 64k ids, the index process's
largest holding while many sessions are open (``docs/benchmarks.md``, "Steady-state footprint").

A sketch holds a 16-byte BLAKE2b digest per whole block of ``BLOCK`` ids and the ids of the last,
partial block as they are: about 1/64 of the prompt plus at most one block. The shared length
against a new prompt is then the run of equal leading digests, and -- when every whole block
matches, as in a chain where the next prompt extends the last -- the exact common prefix with the
partial block. When the prompts part inside a whole block, the shared length stops at that block's
start: the record stores up to ``BLOCK - 1`` ids more than it had to, which is rare (a drift or a
break) and never wrong, since every shared id was compared by digest or byte for byte.
"""

from __future__ import annotations

from hashlib import blake2b

from openenv_harness.recorder.fidelity import common_prefix_len

#: Ids per digested block (4 bytes each in a prompt's stored form).
BLOCK = 256
_BLOCK_BYTES = BLOCK * 4
_DIGEST = 16


def block_digests(prompt: bytes) -> bytes:
    """The digests of ``prompt``'s whole blocks, concatenated."""
    view = memoryview(prompt)
    whole = len(prompt) - len(prompt) % _BLOCK_BYTES
    return b"".join(blake2b(view[i : i + _BLOCK_BYTES], digest_size=_DIGEST).digest()
                    for i in range(0, whole, _BLOCK_BYTES))


class PromptSketch:
    """One stored prompt, as a delta base: its record's seq, block digests and partial last block."""

    __slots__ = ("seq", "digests", "tail")

    def __init__(self, seq: int, prompt: bytes, digests: bytes) -> None:
        self.seq = seq
        self.digests = digests
        self.tail = prompt[len(digests) // _DIGEST * _BLOCK_BYTES :]

    def shared_bytes(self, prompt: bytes, digests: bytes) -> int:
        """Bytes of ``prompt`` (with its ``block_digests``) known equal to this base's start."""
        blocks = common_prefix_len(self.digests, digests) // _DIGEST
        if blocks * _DIGEST < len(self.digests):  # they part inside a whole block: stop at its start
            return blocks * _BLOCK_BYTES
        start = blocks * _BLOCK_BYTES
        return start + common_prefix_len(self.tail, prompt[start : start + len(self.tail)])

    def nbytes(self) -> int:
        return len(self.digests) + len(self.tail)


def prompt_delta(candidates: list[PromptSketch], prompt: bytes, digests: bytes) -> tuple[int | None, int, bytes]:
    """``(base_seq, shared_tokens, tail_bytes)``: the prompt as a prefix of an earlier record's prompt
    (the candidate sharing the most tokens) plus the new tokens. A sub-agent interleaved with its
    parent finds its own previous call among the candidates."""
    best_seq, best = None, 0
    for sketch in candidates:
        shared = sketch.shared_bytes(prompt, digests) // 4
        if shared > best:
            best_seq, best = sketch.seq, shared
    if best_seq is None:
        return None, 0, prompt
    return best_seq, best, prompt[best * 4 :]
