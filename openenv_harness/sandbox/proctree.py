"""Find and kill every process a sandbox started, including the ones that left its process group.

Why process groups alone are not enough: both supported agents run each shell tool call in a new
session (Node's ``detached`` spawn calls ``setsid``), so a server the model started with ``&`` lives
in a group the sandbox never created, and killing the agent's group leaves it running. Two extra
nets catch those processes:

* **Descendants**, by walking parent links in ``/proc`` while the parent is still alive.
* **A marker in the environment** (``MARKER_ENV=<sandbox id>``), inherited by every process the
  sandbox starts and by everything they start, which survives re-parenting to init. Only a process
  that deliberately clears its environment *and* was orphaned escapes both.

Everything is signalled by process group (SIGTERM, then SIGKILL after a grace period). Without
``/proc`` (not Linux) only the known groups are signalled.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

#: Set in every sandboxed process's environment; its value identifies the sandbox.
MARKER_ENV = "OPENENV_HARNESS_SANDBOX_ID"

_PROC = Path("/proc")


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgrp: int
    state: str

    @property
    def alive(self) -> bool:
        """Zombies and dead entries cannot be killed, only reaped by their parent."""
        return self.state not in ("Z", "X")


def process_table() -> dict[int, ProcInfo]:
    """Every process visible in ``/proc`` ({} where there is no ``/proc``)."""
    table: dict[int, ProcInfo] = {}
    if not _PROC.is_dir():
        return table
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        # After the parenthesised command name (which may contain spaces): state ppid pgrp ...
        fields = raw[raw.rfind(")") + 2 :].split()
        if len(fields) >= 3:
            pid = int(entry.name)
            table[pid] = ProcInfo(pid=pid, ppid=int(fields[1]), pgrp=int(fields[2]), state=fields[0])
    return table


def with_descendants(table: dict[int, ProcInfo], roots: Iterable[int]) -> set[int]:
    """``roots`` plus every process below them by parent links."""
    children: dict[int, list[int]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info.pid)
    found: set[int] = set()
    stack = [pid for pid in roots if pid in table]
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found.add(pid)
        stack.extend(children.get(pid, ()))
    return found


def group_members(table: dict[int, ProcInfo], groups: Iterable[int]) -> set[int]:
    wanted = set(groups)
    return {info.pid for info in table.values() if info.pgrp in wanted}


def marked(table: dict[int, ProcInfo], value: str) -> set[int]:
    """Processes whose environment carries ``MARKER_ENV=value``."""
    needle = f"{MARKER_ENV}={value}".encode()
    found: set[int] = set()
    for pid, info in table.items():
        if not info.alive:
            continue
        try:
            environ = (_PROC / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.add(pid)
    return found


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still exists (a group we may not signal counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def terminate(
    known_groups: Iterable[int],
    find: Callable[[dict[int, ProcInfo]], set[int]],
    grace_s: float,
    reap: Callable[[], object] = lambda: None,
) -> None:
    """SIGTERM ``known_groups`` and the groups of every process ``find`` returns; SIGKILL after ``grace_s``.

    ``find`` is asked again while waiting, so processes forked during shutdown are caught too, and a
    group once found stays on the list (its members may be re-parented and no longer found).
    ``reap`` is called while waiting so the caller can collect its own exited children.
    """
    own_group = os.getpgrp()
    groups: set[int] = {g for g in known_groups if g > 1 and g != own_group}
    signalled: dict[int, set[int]] = {signal.SIGTERM: set(), signal.SIGKILL: set()}

    def discover() -> dict[int, ProcInfo]:
        table = process_table()
        for pid in find(table):
            pgrp = table[pid].pgrp
            if pgrp > 1 and pgrp != own_group:
                groups.add(pgrp)
        return table

    def send(sig: signal.Signals) -> None:
        for pgid in groups - signalled[sig]:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            signalled[sig].add(pgid)

    def alive(table: dict[int, ProcInfo]) -> bool:
        if not table:
            return any(group_alive(pgid) for pgid in groups)
        return any(info.alive and info.pgrp in groups for info in table.values())

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        deadline = time.monotonic() + wait_s
        while True:
            reap()
            table = discover()
            if not alive(table):
                return
            send(sig)
            if time.monotonic() >= deadline:
                break
            time.sleep(0.02)
