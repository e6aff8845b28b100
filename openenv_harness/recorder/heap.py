"""Memory housekeeping for a process that runs only a recorder (``serve``, ``python -m ...recorder``).

Why: every call moves a few large, short-lived buffers through the heap -- the agent's body, the
engine's reply with its prompt ids, the journal frame -- tens to hundreds of KB each at 8k-token
prompts. glibc's allocator keeps what is freed for reuse, so after a burst of 64 sessions the
process stays at its high-water mark (measured: 208-216 MB resident after the load, against
139-189 MB with the trimmer below, at the same CPU per call). Fixing glibc's mmap threshold
instead returned memory too but cost ~20 % more CPU per call in page faults.

Both helpers act on the whole process, so only a process the recorder owns uses them: in a
trainer's own process (``RecorderServer``) they would freeze or trim the host's heap too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

#: How often freed memory is handed back (seconds): a trim takes about a millisecond.
TRIM_EVERY_S = 1.0


def freeze_startup_heap() -> None:
    """Move everything alive now out of the garbage collector's reach.

    A recorder process holds ~83k long-lived objects (FastAPI, pydantic, OpenEnv, numpy) that the
    collector's full passes walk every time -- 48-55 ms a pass, several times a minute under load,
    landing on some unlucky call's reply. Frozen, a full pass walks only what was created since.
    """
    gc.collect()
    gc.freeze()


def libc_malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    return lambda: fn(0)


class HeapTrimmer:
    """A daemon thread that calls ``trim`` every ``every_s`` seconds until stopped."""

    def __init__(self, trim: Callable[[], object] | None = None, *, every_s: float = TRIM_EVERY_S) -> None:
        self._trim = trim if trim is not None else libc_malloc_trim()
        self.every_s = every_s
        self.trims = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self._trim is not None

    def start(self) -> HeapTrimmer:
        if self._trim is None:
            log.info("heap trimming unavailable: the C library has no malloc_trim")
            return self
        self._thread = threading.Thread(target=self._run, name="oeh-heap-trim", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        assert self._trim is not None
        while not self._stop.wait(self.every_s):
            self._trim()
            self.trims += 1
