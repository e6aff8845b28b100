"""The index process's CPU priority (``RecorderConfig.index_priority``): ``idle``, ``low`` or ``normal``.

Why lower it at all: indexing is background work with a backlog that absorbs delay; the calls it
overlaps are not. On cores that the engine, the agents and the recorder already share, a waking
recorder, engine or agent should run before the indexer's batch. Measured at one session of 8k
prompts (``docs/benchmarks.md``), the recorder's added p99 fell from +4.0--4.6 ms at ``low`` to
+3.1--3.5 ms at ``idle``.

- ``idle`` (the default) is adaptive: the indexing thread runs under ``SCHED_IDLE`` -- only on CPU
  time nothing else wants -- while it keeps up, and under the normal policy while it is behind (a
  batch or more queued) or someone waits for it (a reader, a session write). The recorder raises it
  (``indexer.ProcessIndexer._wake_child``), since an idle-priority process on busy cores may not run
  for a long while: to nice +10 when a batch is queued, to the recorder's own priority when appends
  are held back or someone waits. It lowers itself once its queue is empty. Measured with two
  busy-looping processes on this 2-core machine: a plain ``SCHED_IDLE`` indexer, never raised, left
  one 8k session 6--8 calls/s and 16 sessions 8--20 calls/s at a p99 of 6--7 s (the backlog fills
  and appends wait); adaptive, 229 and 539 calls/s (p99 61 ms), against 120 and 208 (p99 253 ms)
  at ``low``. Leaving ``SCHED_IDLE`` needs
  ``CAP_SYS_NICE`` or an ``RLIMIT_NICE`` of 20; where the system refuses it, ``idle`` runs as
  ``low`` instead (with a warning), never stuck at idle priority.
- ``low``: nice +10 (~1/10 of a normal process's share when the cores are contended).
- ``normal``: the recorder's own priority.

Linux applies a scheduling policy per thread: only the thread that indexes is changed.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

#: The settings, in ``RecorderConfig.index_priority`` and on the command lines.
PRIORITIES = ("normal", "low", "idle")
#: How much lower than the recorder the index process runs at ``low`` (``nice(2)``).
NICENESS = 10


def can_leave_idle() -> bool:
    """Whether a thread here may go from ``SCHED_IDLE`` back to the normal policy.

    Tried on a throwaway thread (policies are per thread), so a refusal changes nothing that lasts.
    """
    allowed: list[bool] = []

    def probe() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            allowed.append(True)
        except (OSError, AttributeError):
            allowed.append(False)

    thread = threading.Thread(target=probe, name="oeh-priority-probe")
    thread.start()
    thread.join()
    return allowed == [True]


class Scheduling:
    """The calling thread's priority under one setting; ``behind``/``caught_up`` adapt ``idle``."""

    def __init__(self, priority: str) -> None:
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {PRIORITIES}, not {priority!r}")
        self.priority = priority
        #: whether ``behind``/``caught_up`` switch the policy (``idle`` where leaving it is allowed)
        self.adaptive = False
        self.idle_now = False

    def apply(self, *, leave_idle_allowed: bool | None = None) -> None:
        """Set the starting priority on the calling thread; a setting the system refuses leaves it as
        it was (with a warning). ``leave_idle_allowed`` overrides the probe (tests)."""
        try:
            if self.priority == "idle":
                allowed = can_leave_idle() if leave_idle_allowed is None else leave_idle_allowed
                if allowed:
                    self.adaptive = True
                    self._set_idle(True)
                    return
                log.warning("index process: this system does not let it leave SCHED_IDLE when behind "
                            "(needs CAP_SYS_NICE or RLIMIT_NICE 20): running at 'low' instead of 'idle'")
                os.nice(NICENESS)
            elif self.priority == "low":
                os.nice(NICENESS)
        except (OSError, AttributeError):  # not allowed here, or not Linux: run at the recorder's priority
            log.warning("index process: could not lower its priority to %r", self.priority)

    def behind(self) -> None:
        """More than a batch is queued, or someone waits: index at the normal policy until caught up."""
        if self.adaptive and self.idle_now:
            self._set_idle(False)

    def caught_up(self) -> None:
        """Nothing is queued: back to idle priority. Set even when this side thinks it is idle: the
        recorder raises the process from outside (``_wake_child``) without it knowing, and an
        index process left raised would run ahead of the calls for good."""
        if self.adaptive:
            self._set_idle(True)

    def _set_idle(self, idle: bool) -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE if idle else os.SCHED_OTHER, os.sched_param(0))
        except OSError as exc:  # the limits changed under us: stop adapting, stay where we are
            self.adaptive = False
            log.warning("index process: cannot change its scheduling policy any more (%s)", exc)
            return
        self.idle_now = idle
