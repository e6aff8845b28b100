"""Files two engine venvs both installed, stored once: the copy in one venv becomes a hard link to the other's.

Why: the SGLang venv and the vLLM venv install the same wheels of torch (the machine's CPU build),
triton, transformers, numpy, sympy and more: about 2 GB written twice. Disk is what a machine's set-up
runs out of first, so a file is shared when it is the same bytes at the same place in both
site-packages. pip never writes into an installed file (an upgrade or an uninstall removes it and
writes a new one), so a venv changed later only stops sharing that file; removing either venv leaves
the other whole. Where hard links cannot be made (another filesystem), nothing changes.
"""

from __future__ import annotations

import errno
import filecmp
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: smaller files are left alone: they hold little of the bytes, and comparing them is most of the work
MIN_BYTES = 64 * 1024


@dataclass(frozen=True)
class Shared:
    """What ``share_identical_files`` linked."""

    files: int
    bytes: int


def share_identical_files(target: Path, source: Path, min_bytes: int = MIN_BYTES) -> Shared:
    """Replace each regular file under ``target`` that has the same bytes and mode as the file at the same
    relative path under ``source`` with a hard link to that file; what it saved."""
    files = saved = 0
    for path in sorted(target.rglob("*")):
        twin = source / path.relative_to(target)
        try:
            mine, theirs = path.lstat(), twin.lstat()
        except OSError:
            continue
        if not (stat.S_ISREG(mine.st_mode) and stat.S_ISREG(theirs.st_mode)) or mine.st_size < min_bytes:
            continue
        if (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino):
            continue  # linked already
        if mine.st_size != theirs.st_size or mine.st_mode != theirs.st_mode or mine.st_dev != theirs.st_dev:
            continue
        if not filecmp.cmp(path, twin, shallow=False):
            continue
        staged = path.with_name(path.name + ".shared-link")
        try:
            os.link(twin, staged)
        except OSError as exc:
            if exc.errno == errno.EMLINK:
                continue  # this file has as many links as its filesystem allows
            if exc.errno in (errno.EXDEV, errno.EPERM, errno.ENOTSUP):
                break  # hard links cannot be made here: every file stays as it is
            raise
        os.replace(staged, path)  # one rename: the file is whole at every moment
        files += 1
        saved += mine.st_size
    return Shared(files, saved)



def share_venv_files(venv: Path, other: Path, name: str, progress: Callable[[str], None]) -> Shared:
    """What ``venv`` installed that the venv ``other`` holds too, stored once; nothing where ``other`` is
    not there."""
    if not (other / "lib").is_dir():
        return Shared(0, 0)
    shared = share_identical_files(venv / "lib", other / "lib")
    if shared.files:
        progress(f"{shared.files} files ({shared.bytes / 1e9:.1f} GB) shared with {name}")
    return shared
