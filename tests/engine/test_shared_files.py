"""Identical files of two venvs stored once: only the same bytes and mode at the same place are linked."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from openenv_harness.engine import shared_files
from openenv_harness.engine.shared_files import share_identical_files

BIG = 70 * 1024  # above the size below which files are left alone


def _write(root: Path, rel: str, data: bytes, mode: int = 0o644) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    return path


def _inode(path: Path) -> int:
    return path.stat().st_ino


@pytest.fixture
def venvs(tmp_path: Path) -> tuple[Path, Path]:
    mine, theirs = tmp_path / "sglang" / "lib", tmp_path / "vllm" / "lib"
    same = os.urandom(BIG)
    _write(mine, "site/torch/lib/libtorch_cpu.so", same, 0o755)
    _write(theirs, "site/torch/lib/libtorch_cpu.so", same, 0o755)
    _write(mine, "site/numpy/core.so", b"a" * BIG)  # same size, other bytes
    _write(theirs, "site/numpy/core.so", b"b" * BIG)
    _write(mine, "site/triton/bin/ptxas", same, 0o755)  # same bytes, other mode
    _write(theirs, "site/triton/bin/ptxas", same, 0o644)
    _write(mine, "site/small.py", b"x = 1\n")  # small: left alone even when equal
    _write(theirs, "site/small.py", b"x = 1\n")
    _write(mine, "site/only_here.so", same)  # nothing at that place in the other venv
    _write(theirs, "site/elsewhere/only_here.so", same)
    return mine, theirs


def test_only_the_same_bytes_and_mode_at_the_same_place_are_linked(venvs: tuple[Path, Path]) -> None:
    mine, theirs = venvs
    before = (mine / "site/torch/lib/libtorch_cpu.so").read_bytes()
    shared = share_identical_files(mine, theirs)
    assert (shared.files, shared.bytes) == (1, BIG)
    assert _inode(mine / "site/torch/lib/libtorch_cpu.so") == _inode(theirs / "site/torch/lib/libtorch_cpu.so")
    assert (mine / "site/torch/lib/libtorch_cpu.so").read_bytes() == before
    assert os.access(mine / "site/torch/lib/libtorch_cpu.so", os.X_OK)
    for rel in ("site/numpy/core.so", "site/triton/bin/ptxas", "site/small.py"):
        assert _inode(mine / rel) != _inode(theirs / rel), rel
    assert (mine / "site/numpy/core.so").read_bytes() == b"a" * BIG
    assert not list(mine.rglob("*.shared-link"))


def test_a_second_pass_links_nothing_more_and_removing_either_venv_leaves_the_other_whole(
        venvs: tuple[Path, Path]) -> None:
    mine, theirs = venvs
    share_identical_files(mine, theirs)
    assert share_identical_files(mine, theirs).files == 0
    data = (theirs / "site/torch/lib/libtorch_cpu.so").read_bytes()
    (theirs / "site/torch/lib/libtorch_cpu.so").unlink()  # what removing the vLLM venv does to it
    assert (mine / "site/torch/lib/libtorch_cpu.so").read_bytes() == data


def test_where_links_cannot_be_made_every_file_stays_as_it_was(venvs: tuple[Path, Path],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    mine, theirs = venvs

    def cross_device(_src: object, _dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(shared_files.os, "link", cross_device)
    inode = _inode(mine / "site/torch/lib/libtorch_cpu.so")
    assert share_identical_files(mine, theirs).files == 0
    assert _inode(mine / "site/torch/lib/libtorch_cpu.so") == inode
    assert not list(mine.rglob("*.shared-link"))


def test_another_link_error_is_raised_not_swallowed(venvs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    mine, theirs = venvs

    def no_space(_src: object, _dst: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shared_files.os, "link", no_space)
    with pytest.raises(OSError, match="No space"):
        share_identical_files(mine, theirs)


def test_the_vllm_venv_shares_what_the_project_venv_holds_once_it_imports(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Set up from the project's venv (``./dev setup``), the engine venv's copy of the same wheels is linked
    to the project venv's."""
    from openenv_harness.engine import setup

    project = tmp_path / "project-venv"
    same = os.urandom(BIG)
    _write(project, "lib/python3.11/site-packages/torch/lib/libtorch_cpu.so", same)
    venv = setup.engine_python(tmp_path / "engine").parent.parent
    monkeypatch.setattr(setup.sys, "prefix", str(project))
    monkeypatch.setattr(setup, "check_platform", lambda: None)
    monkeypatch.setattr(setup, "require_free_space", lambda *_a: None)

    def pip(cmd: list[str], what: str) -> str:  # what the venv and pip would leave: the same wheel's file
        _write(venv, "lib/python3.11/site-packages/torch/lib/libtorch_cpu.so", same)
        return ""

    monkeypatch.setattr(setup, "_run", pip)
    imports = iter([False, True])
    monkeypatch.setattr(setup, "_venv_ok", lambda _p: next(imports))
    messages: list[str] = []
    setup.install_vllm(tmp_path / "engine", messages.append)
    rel = "lib/python3.11/site-packages/torch/lib/libtorch_cpu.so"
    assert _inode(venv / rel) == _inode(project / rel)
    assert messages[-1] == f"1 files ({BIG / 1e9:.1f} GB) shared with the project's venv"
