"""What the indexer keeps of a session's latest prompts to delta the next one: sketches, not ids.

Why: a record stores its prompt as (an earlier record, how many ids the two share, the new ids), so
the indexer keeps each session's latest prompts as candidate bases. Kept as ids, that was 4 bytes
per id per base for each of up to 512 sessions -- 256 KB a base at 64k ids, the index process's
largest holding while many sessions are open (``docs/benchmarks.md``, "Steady-state footprint").

A base is now a ``PromptSketch`` (``recorder/chain/prefix.py``: block digests and the partial last block,
about 1/128 of the prompt plus at most one block). A chain, whose next prompt extends the last, still shares every id.
When two prompts part inside a whole block, the shared length stops at that block's start: the
record stores up to ``BLOCK - 1`` ids more than it had to, which is rare (a drift or a break) and
never wrong, since every shared id was compared by digest or byte for byte.
"""

from __future__ import annotations

from openenv_harness.recorder.chain.prefix import BLOCK, PromptSketch, block_digests

__all__ = ["BLOCK", "PromptSketch", "block_digests", "prompt_delta"]


def prompt_delta(candidates: list[PromptSketch], prompt: bytes, digests: bytes) -> tuple[int | None, int, bytes]:
    """``(base_seq, shared_tokens, tail_bytes)``: the prompt as a prefix of an earlier record's prompt
    (the candidate sharing the most tokens) plus the new tokens. A sub-agent interleaved with its
    parent finds its own previous call among the candidates."""
    best_seq, best = None, 0
    for sketch in candidates:
        shared = sketch.common_prefix(prompt, digests)[0] // 4
        if shared > best:
            best_seq, best = sketch.seq, shared
    if best_seq is None:
        return None, 0, prompt
    return best_seq, best, prompt[best * 4 :]
