"""One bound, shared by every session, on the prompt spans their ``PromptIdsReader`` remember.

Why: a reader keeps its session's last prompt as text and ids (about 10 bytes per id) so that the
next call parses only its new turn -- at 64k ids that saves ~6 ms of parsing a call, but it is
640 KB per session, held between calls. Training runs keep hundreds to thousands of sessions open
while only some of them are mid-conversation, so per session that was the recorder's largest
holding (``docs/benchmarks.md``, "Steady-state footprint"). The spans are only a cache: a reader
without them parses the whole span, with the same result. So they live under one budget, least
recently used session out first: memory follows the sessions calling now, not the sessions open.

Used from the event loop only (every reader is), so no lock.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Protocol

#: Bytes of remembered spans (text and ids) in all: 64 sessions at 64k ids fit (~41 MB).
SPAN_BUDGET_BYTES = 64 << 20


class _Holder(Protocol):
    def drop_spans(self) -> None: ...


class SpanBudget:
    """Which readers may keep their spans: the most recently charged, up to ``limit_bytes`` in all."""

    def __init__(self, limit_bytes: int = SPAN_BUDGET_BYTES) -> None:
        self.limit_bytes = limit_bytes
        self._held: OrderedDict[int, tuple[weakref.ref[_Holder], int]] = OrderedDict()
        self._total = 0

    @property
    def total_bytes(self) -> int:
        return self._total

    def __len__(self) -> int:
        return len(self._held)

    def charge(self, holder: _Holder, nbytes: int) -> None:
        """``holder`` now keeps ``nbytes``; the least recently charged others drop theirs past the limit."""
        key = id(holder)
        old = self._held.pop(key, None)
        if old is not None:
            self._total -= old[1]
            ref = old[0]
        else:
            def gone(_: weakref.ref[_Holder], key: int = key) -> None:
                self._gone(key)

            ref = weakref.ref(holder, gone)
        self._held[key] = (ref, nbytes)
        self._total += nbytes
        while self._total > self.limit_bytes and len(self._held) > 1:
            victim_key, (victim_ref, size) = next(iter(self._held.items()))
            if victim_key == key:
                break  # only this one is left over the limit: it keeps its spans until the next charge
            del self._held[victim_key]
            self._total -= size
            victim = victim_ref()
            if victim is not None:
                victim.drop_spans()

    def release(self, holder: _Holder) -> None:
        self._gone(id(holder))

    def _gone(self, key: int) -> None:
        entry = self._held.pop(key, None)
        if entry is not None:
            self._total -= entry[1]
