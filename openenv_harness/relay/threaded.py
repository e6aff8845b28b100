"""Run a ``RelayDialer`` for synchronous callers, on a private event loop in a daemon thread.

Why: the ``Sandbox`` interface (and ``huggingface_hub``'s Sandbox client under it) is synchronous,
while the dialer must keep a WebSocket alive and serve calls at all times -- also while the
caller's thread is blocked in a long ``run()``. A thread of its own gives it that.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from openenv_harness.relay.dialer import DialerStats, RelayDialer


class DialerThread:
    """Owns a thread, an event loop and the dialer running on it."""

    def __init__(self, make_dialer: Callable[[], RelayDialer], *, name: str = "relay-dialer") -> None:
        self._make_dialer = make_dialer
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._dialer: RelayDialer | None = None

    @property
    def dialer(self) -> RelayDialer:
        if self._dialer is None:
            raise RuntimeError("the dialer thread is not started")
        return self._dialer

    @property
    def stats(self) -> DialerStats:
        return self.dialer.stats

    def start(self) -> "DialerThread":
        """Start the loop thread and the dialer on it; returns once dialling has begun."""
        if self._thread is not None:
            return self
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread

        async def begin() -> RelayDialer:
            dialer = self._make_dialer()  # built on the loop so its asyncio objects belong there
            await dialer.start()
            return dialer

        try:
            self._dialer = asyncio.run_coroutine_threadsafe(begin(), loop).result(timeout=30)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_connected(self, timeout_s: float) -> None:
        """Block until the relay link is up (``RelayUnavailableError`` after ``timeout_s``)."""
        future = asyncio.run_coroutine_threadsafe(self.dialer.wait_connected(timeout_s), self._require_loop())
        future.result(timeout=timeout_s + 5)

    def allow_path_prefix(self, prefix: str) -> None:
        """Thread-safe ``RelayDialer.allow_path_prefix``."""
        self._require_loop().call_soon_threadsafe(self.dialer.allow_path_prefix, prefix)

    def reconnect(self) -> None:
        """Thread-safe ``RelayDialer.reconnect``."""
        self._require_loop().call_soon_threadsafe(self.dialer.reconnect)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Close the dialer, stop the loop and join the thread. Safe to call twice."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            if self._dialer is not None and loop.is_running():
                asyncio.run_coroutine_threadsafe(self._dialer.aclose(), loop).result(timeout=timeout_s)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout_s)
            if not thread.is_alive():
                loop.close()
            self._loop = self._thread = None

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the dialer thread is not started")
        return self._loop

    def __enter__(self) -> "DialerThread":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
