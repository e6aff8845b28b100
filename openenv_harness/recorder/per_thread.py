"""One instance of a stateful helper per thread, made on first use.

Why: the recorder's fast parsers and codecs (a simdjson parser, zstd contexts) keep buffers between
calls -- reusing them is most of their speed -- and are not safe to share between threads. The
event loop, the index thread and test threads each get their own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def per_thread(factory: Callable[[], T]) -> Callable[[], T]:
    """A getter returning this thread's instance, built by ``factory`` the first time it is asked for."""
    local = threading.local()

    def get() -> T:
        try:
            value: T = local.value
        except AttributeError:
            value = local.value = factory()
        return value

    return get
