"""Finding and stopping one command's processes inside a container, from outside it.

Why a program run inside the container: ``docker exec`` gives no handle on the processes it starts
(killing the client leaves them running), and both agents run each shell tool in a session of its
own, so neither a process group nor the exec's own pid covers what a command started. Every command
the container sandbox starts carries a marker in its environment, which children inherit; this
standard-library program, run with ``python3 -c`` in the container, signals every process carrying
the marker and every descendant of one (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

#: The environment variable that names the command a process belongs to.
COMMAND_MARKER_ENV = "OEH_COMMAND"

KILL_PROGRAM = r"""
import os, signal, sys, time

marker, grace = sys.argv[1].encode(), float(sys.argv[2])
me = os.getpid()

def table():
    parents, hits = {}, set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            parents[pid] = int(stat[stat.rindex(b")") + 2:].split()[1])
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    hits.add(pid)
        except (OSError, ValueError):
            continue
    found, grew = set(hits), True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in found and pid not in found:
                found.add(pid)
                grew = True
    return found

def signal_all(pids, signum):
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass

targets = table()
signal_all(targets, signal.SIGTERM)
deadline = time.monotonic() + grace
while targets and time.monotonic() < deadline:
    time.sleep(0.05)
    targets = table()
for _ in range(5):
    if not targets:
        break
    signal_all(targets, signal.SIGKILL)
    time.sleep(0.05)
    targets = table()
print(len(targets))
"""


def kill_command(marker_value: str, grace_s: float) -> list[str]:
    """The argv (after ``docker exec <container>``) that stops every process of one command."""
    return ["python3", "-c", KILL_PROGRAM, f"{COMMAND_MARKER_ENV}={marker_value}", str(grace_s)]
