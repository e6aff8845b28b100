"""A session's call numbers: each stored record takes the next one, with no gap.

Why one owner: a number is taken when a call's record is built (``call/pending.py: base_metadata``) and given back
when the store refuses that record (``call/record.py: commit``); a restart starts from the stored records'
count (``session/registry.py``). Kept here, the rule for giving one back -- only while no later call took
one -- lives beside the counter it protects.
"""

from __future__ import annotations


class CallNumbers:
    """The next call index of one session."""

    __slots__ = ("_next",)

    def __init__(self, next_index: int = 0) -> None:
        self._next = next_index

    @property
    def next(self) -> int:
        """The number the next stored call will take (also: how many the session has stored)."""
        return self._next

    def take(self) -> int:
        index = self._next
        self._next += 1
        return index

    def give_back(self, index: int) -> bool:
        """Return ``index`` if it is the latest one taken; whether it went back (a later call that has
        already taken a number keeps its own)."""
        if self._next == index + 1:
            self._next = index
            return True
        return False
