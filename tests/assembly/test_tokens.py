import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openenv_harness.assembly.errors import AssemblyError
from openenv_harness.assembly.tokens import (
    common_prefix_tokens,
    pack_ids,
    starts_with_at,
)

ids = st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=40)


def _naive_common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=200, deadline=None)
@given(a=ids, b=ids, shared=ids)
def test_common_prefix_matches_naive(a: list[int], b: list[int], shared: list[int]) -> None:
    x, y = shared + a, shared + b
    assert common_prefix_tokens(pack_ids(x), pack_ids(y)) == _naive_common_prefix(x, y)


def test_common_prefix_honours_a_known_start() -> None:
    a, b = pack_ids([1, 2, 3, 4]), pack_ids([1, 2, 9, 4])
    assert common_prefix_tokens(a, b, start_token=1) == 2
    assert common_prefix_tokens(a, a) == 4
    assert common_prefix_tokens(pack_ids([]), a) == 0


def test_byte_level_match_is_not_a_token_match() -> None:
    # 256 and 1 share their low byte; a byte-wise prefix must not count as a token prefix.
    assert common_prefix_tokens(pack_ids([7, 256]), pack_ids([7, 1])) == 1
    assert not starts_with_at(pack_ids([7, 256]), pack_ids([1]), 1)
    assert starts_with_at(pack_ids([7, 256, 3]), pack_ids([256, 3]), 1)


@pytest.mark.parametrize("bad", [[-1], [1.5], ["3"], [2**32], "abc"])
def test_pack_rejects_non_ids(bad: object) -> None:
    with pytest.raises(AssemblyError, match="non-negative integers|list of integers"):
        pack_ids(bad)  # type: ignore[arg-type]
