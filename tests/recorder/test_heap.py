"""Process-level memory housekeeping of a recorder process."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from openenv_harness.recorder.heap import HeapTrimmer, libc_malloc_trim


def test_the_trimmer_trims_periodically_and_stops() -> None:
    calls: list[float] = []
    trimmer = HeapTrimmer(lambda: calls.append(time.monotonic()), every_s=0.02).start()
    deadline = time.monotonic() + 5
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    trimmer.stop()
    assert len(calls) >= 3 and trimmer.trims == len(calls)
    settled = len(calls)
    time.sleep(0.1)
    assert len(calls) == settled, "no trim after stop()"
    assert not any(t.name == "oeh-heap-trim" for t in threading.enumerate())


def test_glibc_trim_is_found_here_and_returns_freed_memory() -> None:
    trim = libc_malloc_trim()
    assert trim is not None, "this Linux/glibc machine has malloc_trim"
    # glibc set to never give memory back on free() by itself (as after a burst, when free chunks sit
    # below live ones): only the trim can return what was freed
    script = (
        "import ctypes, ctypes.util, sys; sys.path.insert(0, %r)\n"
        "libc = ctypes.CDLL(ctypes.util.find_library('c'))\n"
        "libc.mallopt(-1, 1 << 30); libc.mallopt(-3, 1 << 24)\n"  # M_TRIM_THRESHOLD, M_MMAP_THRESHOLD
        "from openenv_harness.recorder.heap import libc_malloc_trim\n"
        "def rss():\n"
        "    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])\n"
        "keep = [bytes(100_000) for _ in range(2000)]\n"
        "high = rss(); del keep; before = rss(); libc_malloc_trim()(); after = rss()\n"
        "print(high, before, after)\n"
    ) % str(__import__("pathlib").Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    high, before, after = map(int, out.stdout.split())
    assert before - after > 100_000, f"the trim, not free(), gave memory back: {high} -> {before} -> {after} KB"


def test_a_missing_trim_is_reported_not_fatal() -> None:
    trimmer = HeapTrimmer(every_s=0.01)
    trimmer._trim = None  # a C library without malloc_trim (musl, macOS)
    assert not trimmer.available
    trimmer.start()
    trimmer.stop()
    assert trimmer.trims == 0


def test_freezing_keeps_live_objects_and_empties_the_collectors_view() -> None:
    script = (
        "import gc, sys; sys.path.insert(0, %r)\n"
        "from openenv_harness.recorder.heap import freeze_startup_heap\n"
        "data = [[i] for i in range(50_000)]\n"  # lists stay tracked (dicts of atoms get untracked)
        "freeze_startup_heap()\n"
        "print(gc.get_freeze_count() > 50_000, len(gc.get_objects()) < 1_000, data[49_999][0])\n"
    ) % str(__import__("pathlib").Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True", "49999"], out.stderr
