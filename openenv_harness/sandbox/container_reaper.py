"""Removing the containers a killed trainer left behind.

Why labels and not a list kept on disk: a trainer killed with SIGKILL writes nothing on its way
out, but the container engine keeps every container's labels. Each container sandbox labels its
container with the process that owns it (host name, pid and the pid's start time, so a reused pid
is not mistaken for the owner); at the first container sandbox a process starts, every labelled
container whose owner is gone is removed, with the host directory it mounted.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
from dataclasses import dataclass

from openenv_harness.sandbox.container_engine import ContainerEngine

log = logging.getLogger(__name__)

#: Every container sandbox's container carries these labels.
SANDBOX_LABEL = "openenv-harness.sandbox"
OWNER_LABEL = "openenv-harness.owner"
HOST_DIR_LABEL = "openenv-harness.host-dir"


def process_start_ticks(pid: int) -> str | None:
    """The pid's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2 :].split()[19].decode()


def this_owner() -> str:
    """The owner label of containers started by this process."""
    return f"{socket.gethostname()}:{os.getpid()}:{process_start_ticks(os.getpid())}"


def owner_alive(owner: str) -> bool:
    """Whether the process an owner label names still runs (a label from another host counts as
    alive: its owner cannot be checked from here)."""
    host, _, rest = owner.partition(":")
    pid_text, _, ticks = rest.partition(":")
    if host != socket.gethostname():
        return True
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    return process_start_ticks(pid) == ticks


@dataclass(frozen=True)
class Orphan:
    container_id: str
    owner: str
    host_dir: str


def orphans(engine: ContainerEngine) -> list[Orphan]:
    """The labelled containers (running or not) whose owner process is gone."""
    listing = engine.run_cli([
        "ps", "-a", "--filter", f"label={SANDBOX_LABEL}",
        "--format", f'{{{{.ID}}}}\t{{{{.Label "{OWNER_LABEL}"}}}}\t{{{{.Label "{HOST_DIR_LABEL}"}}}}',
    ]).stdout.decode()
    found = []
    for line in listing.splitlines():
        container_id, owner, host_dir = (line.split("\t") + ["", ""])[:3]
        if container_id and not owner_alive(owner):
            found.append(Orphan(container_id, owner, host_dir))
    return found


def reap_orphans(engine: ContainerEngine) -> list[Orphan]:
    """Remove every orphan container and its host directory; returns what was removed."""
    gone = orphans(engine)
    if not gone:
        return []
    engine.run_cli(["rm", "-f", "-v", *[orphan.container_id for orphan in gone]], check=False)
    for orphan in gone:
        if orphan.host_dir and os.path.basename(orphan.host_dir).startswith("openenv-harness-ctr-"):
            shutil.rmtree(orphan.host_dir, ignore_errors=True)
    log.warning("removed %d container(s) left by trainer process(es) that no longer run: %s", len(gone),
                ", ".join(sorted({orphan.owner for orphan in gone})))
    return gone
