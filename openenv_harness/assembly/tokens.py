"""Token-id arrays packed as bytes, so prefix tests are one ``memcmp`` instead of a Python loop.

Why: a 100-call session with 20k-token prompts means millions of id comparisons. Packing each id
array once into fixed-width bytes turns "is A a token prefix of B" into ``B.startswith(A)`` and a
longest-common-prefix into a binary search over slice equality, both running in C. Packing also
validates the ids: negative, fractional or non-integer ids are rejected by ``array`` itself.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from openenv_harness.assembly.errors import AssemblyError


def _four_byte_typecode() -> str:
    for code in ("I", "L"):
        if array(code).itemsize == 4:
            return code
    raise RuntimeError("no 4-byte unsigned array typecode on this platform")


TYPECODE = _four_byte_typecode()
#: Bytes per packed token id.
WIDTH = 4


def pack_ids(ids: Sequence[int], *, what: str = "token ids") -> bytes:
    """Pack ids as unsigned 32-bit values; raise ``AssemblyError`` for anything that is not one."""
    if isinstance(ids, (str, bytes)):
        raise AssemblyError(f"{what} must be a list of integers, got {type(ids).__name__}")
    try:
        return array(TYPECODE, ids).tobytes()
    except (TypeError, OverflowError, ValueError) as exc:
        raise AssemblyError(f"{what} must be non-negative integers below 2**32 ({exc})") from exc


def starts_with_at(whole: bytes, part: bytes, at_token: int = 0) -> bool:
    """Whether ``whole`` holds ``part`` starting at token position ``at_token``."""
    return whole.startswith(part, at_token * WIDTH)


def common_prefix_tokens(a: bytes, b: bytes, start_token: int = 0) -> int:
    """Length in tokens of the longest common prefix of two packed arrays.

    ``start_token`` is a position the caller already knows to be shared (it is not re-checked).
    Binary search over slice equality: O(T log T) bytes compared in C, no per-token Python work.
    """
    lo = start_token
    hi = min(len(a), len(b)) // WIDTH
    if lo >= hi:
        return hi
    if a[lo * WIDTH : hi * WIDTH] == b[lo * WIDTH : hi * WIDTH]:
        return hi
    # Invariant: the first ``lo`` tokens match, the first ``hi`` tokens do not.
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo * WIDTH : mid * WIDTH] == b[lo * WIDTH : mid * WIDTH]:
            lo = mid
        else:
            hi = mid
    return lo
