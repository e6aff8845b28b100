"""Sessions spread over several recorders: the least busy one gets the next rollout.

Why: one recorder is one event loop, about a core's worth of calls (``docs/scale-out.md``). A
trainer with more concurrent sandboxes than that runs several recorders and gives the factory all
their URLs. Each rollout's session lives on the recorder that created it, and that session's
trace is read from there (the ``HarnessSession`` keeps the client of its recorder).

Placement is least live sessions: each recorder's own count (``GET /admin/health``: sessions not
yet closed, whoever created them -- several trainer processes may share the recorders) plus the
placements this pool has under way and not yet counted there. Ties go round-robin. A recorder that
does not answer is skipped for this placement, so one recorder down leaves the others serving new
rollouts; only when none answers does placement fail, naming each one's cause.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

import httpx

from openenv_harness.recorder.client import RecorderAPIError, RecorderClient


class NoRecorderAvailable(RuntimeError):
    """No recorder of the pool could take a session."""


@dataclass(frozen=True)
class RecorderSlot:
    """One recorder: where the trainer reaches it, and where the agent does (a tunnel may differ)."""

    url: str
    agent_url: str


def as_list(value: str | list[str] | tuple[str, ...]) -> list[str]:
    """A recorder URL or several, as a list of URLs without trailing slashes."""
    urls = [value] if isinstance(value, str) else list(value)
    if not urls:
        raise ValueError("at least one recorder URL is needed")
    return [u.rstrip("/") for u in urls]


class RecorderPool:
    """Several recorders sharing one admin token; ``place()`` picks one for the next session."""

    def __init__(self, urls: str | list[str], admin_token: str, *, agent_urls: str | list[str] | None = None,
                 health_timeout_s: float = 10.0) -> None:
        trainer = as_list(urls)
        agent = as_list(agent_urls) if agent_urls is not None else trainer
        if len(agent) != len(trainer):
            raise ValueError(f"{len(trainer)} recorder URLs but {len(agent)} agent recorder URLs")
        self.slots = [RecorderSlot(t, a) for t, a in zip(trainer, agent)]
        self._token = admin_token
        self._timeout = health_timeout_s
        self._lock = threading.Lock()
        self._pending = {slot.url: 0 for slot in self.slots}
        self._turn = itertools.count()

    def _live(self, slot: RecorderSlot) -> int:
        with RecorderClient(slot.url, self._token, timeout_s=self._timeout) as client:
            sessions = client.health().get("sessions") or {}
        return sum(int(n) for status, n in sessions.items() if status != "closed")

    def place(self) -> RecorderSlot:
        """The recorder with the fewest live sessions; the caller must ``release`` it once its
        session exists there (or failed to)."""
        counts: dict[str, int] = {}
        down: dict[str, str] = {}
        for slot in self.slots:
            try:
                counts[slot.url] = self._live(slot)
            except (httpx.HTTPError, RecorderAPIError, OSError, ValueError) as exc:
                down[slot.url] = f"{type(exc).__name__}: {exc}"
        if not counts:
            causes = "; ".join(f"{url}: {why}" for url, why in down.items())
            raise NoRecorderAvailable(f"none of the {len(self.slots)} recorders answered: {causes}")
        with self._lock:
            start = next(self._turn)
            order = self.slots[start % len(self.slots):] + self.slots[:start % len(self.slots)]
            best = min((s for s in order if s.url in counts), key=lambda s: counts[s.url] + self._pending[s.url])
            self._pending[best.url] += 1
        return best

    def release(self, slot: RecorderSlot) -> None:
        with self._lock:
            self._pending[slot.url] = max(0, self._pending[slot.url] - 1)
