"""A session's retry memory: the calls in flight by request digest, and the digests of its latest records.

Why one owner: a retried call is answered from its first attempt (``call/admit.py: dedupe``), either from the
attempt still in flight (its twin) or from the stored record of a recent one. The pipeline opens and
closes twins, the record step notes recent digests, a close forgets them; each does so through this
object, so the window's bound and the twin's lifetime are kept in one place.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any


class ReplayWindow:
    """Twins in flight (request digest -> the first attempt's future) and recent digests (bounded)."""

    __slots__ = ("_recent", "_twins")

    def __init__(self) -> None:
        self._twins: dict[str, asyncio.Future[Any]] = {}
        self._recent: OrderedDict[str, int] = OrderedDict()

    def first_attempt(self, digest: str) -> asyncio.Future[Any] | int | None:
        """What a retry of this body is answered from: the first attempt still in flight (its twin), else
        the number of a recent record of it, else None."""
        twin = self._twins.get(digest)
        return twin if twin is not None else self._recent.get(digest)

    def open_twin(self, digest: str) -> asyncio.Future[Any]:
        """This call is now the attempt a retry of its body waits for (it resolves to the agent's reply)."""
        twin = self._twins[digest] = asyncio.get_running_loop().create_future()
        return twin

    def close_twin(self, digest: str, twin: asyncio.Future[Any]) -> None:
        """The call behind ``twin`` ended; a later attempt that took its place keeps its own."""
        if self._twins.get(digest) is twin:
            del self._twins[digest]

    def remember(self, digest: str, call_index: int, window: int) -> None:
        """A record of this body was stored; the ``window`` latest digests are kept."""
        self._recent[digest] = call_index
        while len(self._recent) > window:
            self._recent.popitem(last=False)

    def forget_recent(self) -> None:
        """A closed session serves no retry: its recent digests go (twins end with their calls)."""
        self._recent.clear()

    def __len__(self) -> int:
        return len(self._recent)
