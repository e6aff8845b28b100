"""SGLang's CPU engine, without starting it: the flags it is started with, the model overlay it reads,
the requirements and the kernel stand-in shipped as package data. The real start is in
``tests/real_engine/test_real_sglang_server.py``."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from openenv_harness.engine import setup as engine_setup
from openenv_harness.engine import sglang_cpu
from openenv_harness.engine.model import QWEN25_CODER_05B
from openenv_harness.engine import shared_files
from openenv_harness.engine.shared_files import Shared
from openenv_harness.engine.sglang_cpu import SGLangSettings, prepare_overlay


def _value(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def test_the_command_starts_the_cpu_engine_on_its_torch_native_path() -> None:
    settings = SGLangSettings(model_dir=Path("/m/model"), python=Path("/v/bin/python"), port=31234)
    cmd = settings.command()
    assert cmd[:3] == ["/v/bin/python", "-m", "sglang.launch_server"]
    assert _value(cmd, "--model-path") == "/m/model"
    assert _value(cmd, "--served-model-name") == QWEN25_CODER_05B.served_name
    assert (_value(cmd, "--host"), _value(cmd, "--port")) == ("127.0.0.1", "31234")
    assert _value(cmd, "--device") == "cpu"
    assert _value(cmd, "--attention-backend") == "torch_native"
    assert _value(cmd, "--max-total-tokens") == "8192"
    assert _value(cmd, "--tool-call-parser") == "qwen25"
    for flag in ("--skip-server-warmup", "--sleep-on-idle", "--cuda-graph-backend-decode=disabled",
                 "--cuda-graph-backend-prefill=disabled"):
        assert flag in cmd


def test_nice_tool_parser_and_extra_args_are_honoured() -> None:
    settings = SGLangSettings(model_dir=Path("/m"), python=Path("/p"), port=1, nice=10, tool_call_parser=None,
                              extra_args=["--random-seed", "0"])
    cmd = settings.command()
    assert cmd[:4] == ["nice", "-n", "10", "/p"]
    assert "--tool-call-parser" not in cmd
    assert cmd[-2:] == ["--random-seed", "0"]


def test_the_dtype_follows_what_this_cpu_computes_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_setup, "cpu_flags", lambda: {"avx2", "avx512f"})
    assert _value(SGLangSettings(model_dir=Path("/m"), python=Path("/p"), port=1).command(), "--dtype") == "float32"
    monkeypatch.setattr(engine_setup, "cpu_flags", lambda: {"avx2", "avx512_bf16"})
    assert "--dtype" not in SGLangSettings(model_dir=Path("/m"), python=Path("/p"), port=1).command()
    chosen = SGLangSettings(model_dir=Path("/m"), python=Path("/p"), port=1, dtype="bfloat16").command()
    assert _value(chosen, "--dtype") == "bfloat16"


def test_a_default_port_is_picked_per_settings() -> None:
    assert SGLangSettings(model_dir=Path("/m"), python=Path("/p")).port > 0


def test_the_environment_turns_the_cpu_engine_on_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_SOMETHING_STALE", "1")
    env = SGLangSettings(model_dir=Path("/m"), python=Path("/p"), port=1).environment()
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert env["OMP_NUM_THREADS"] == str(os.cpu_count() or 1)
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
    assert "SGLANG_SOMETHING_STALE" not in env


def _converted(tmp_path: Path, architectures: list[str] | None) -> Path:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"architectures": architectures, "hidden_size": 896}))
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                 "generation_config.json"):
        (hf / name).write_text(name)
    return hf


def test_the_overlay_links_the_weights_and_names_the_architecture(tmp_path: Path) -> None:
    hf = _converted(tmp_path, None)
    out = prepare_overlay(hf, tmp_path / "overlay", ["Qwen2ForCausalLM"])
    config = json.loads((out / "config.json").read_text())
    assert config == {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 896}
    assert not (out / "config.json").is_symlink()
    assert json.loads((hf / "config.json").read_text())["architectures"] is None, "the source is never touched"
    for name in ("model.safetensors", "tokenizer.json", "chat_template.jinja", "generation_config.json"):
        assert (out / name).is_symlink() and (out / name).resolve() == (hf / name).resolve()


def test_the_overlay_keeps_a_named_architecture_and_is_rebuilt_in_place(tmp_path: Path) -> None:
    hf = _converted(tmp_path, ["Qwen2ForCausalLM"])
    out = tmp_path / "overlay"
    prepare_overlay(hf, out, ["Other"])
    (hf / "tokenizer_config.json").unlink()
    prepare_overlay(hf, out, ["Other"])
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert not (out / "tokenizer_config.json").exists() and not (out / "tokenizer_config.json").is_symlink()


def test_the_requirements_ship_with_the_package_and_hold_no_cuda_only_package() -> None:
    lines = [ln.split("#")[0].strip() for ln in sglang_cpu.REQUIREMENTS.read_text().splitlines()]
    names = {ln.split("=")[0].split("<")[0].split(">")[0].split("[")[0].lower() for ln in lines if ln}
    assert {"transformers", "xgrammar", "tokenizers", "fastapi", "uvicorn"} <= names
    cuda_only = {"cuda-python", "flash-attn-4", "flashinfer_python", "nvidia-cutlass-dsl", "sglang-kernel",
                 "sgl-deep-gemm", "torch_memory_saver", "tilelang", "torch", "sglang"}
    assert not names & cuda_only
    # PyPI's torchvision is CUDA-linked and timm requires it: the placeholder stands in instead
    assert not names & {"torchvision", "timm"}
    assert sglang_cpu.KERNEL_STANDIN.is_file() and sglang_cpu.TORCHVISION_PLACEHOLDER.is_file()


def _standin() -> object:
    """The stand-in loaded from its file (it is never imported by name: it belongs to SGLang's venv)."""
    pytest.importorskip("torch", reason="the stand-in is plain torch, which the compat extra brings "
                        "(OEH_WITH_COMPAT=0 leaves it out); its import is checked in the SGLang venv by setup")
    spec = importlib.util.spec_from_file_location("sgl_kernel_standin", sglang_cpu.KERNEL_STANDIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_kernel_standin_fills_the_request_to_token_table() -> None:
    kernel: object = _standin()
    import torch

    table = torch.zeros((3, 8), dtype=torch.int32)
    kernel.assign_req_to_token_pool_cpu(  # type: ignore[attr-defined]
        torch.tensor([2, 0]), table, torch.tensor([1, 0]), torch.tensor([4, 2]),
        torch.tensor([10, 11, 12, 20, 21], dtype=torch.int64), table.shape[1])
    assert table[2].tolist() == [0, 10, 11, 12, 0, 0, 0, 0]
    assert table[0].tolist() == [20, 21, 0, 0, 0, 0, 0, 0]
    assert table[1].tolist() == [0] * 8


def test_every_other_kernel_name_imports_and_refuses_when_called() -> None:
    kernel: object = _standin()
    op = getattr(kernel, "copy_all_layer_kv_cache_cpu")
    with pytest.raises(NotImplementedError, match="not published on PyPI"):
        op(1, 2)
    with pytest.raises(AttributeError):
        getattr(kernel, "__path__")


def test_the_project_never_imports_the_standin() -> None:
    package = Path(sglang_cpu.__file__).parents[1]
    importers = [p for p in package.rglob("*.py") if p != sglang_cpu.KERNEL_STANDIN
                 and ("import sglang_cpu_kernel" in p.read_text() or "engine.sglang_cpu_kernel" in p.read_text())]
    assert importers == []


def test_an_installed_venv_is_not_reinstalled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = sglang_cpu.sglang_python(tmp_path)
    python.parent.mkdir(parents=True)
    python.write_text("")
    (python.parent.parent / "openenv-sglang.json").write_text(
        json.dumps({"sglang": sglang_cpu.SGLANG_VERSION, "torch": sglang_cpu.TORCH_VERSION}))
    monkeypatch.setattr(sglang_cpu, "_install_standins", lambda _p: None)
    monkeypatch.setattr(sglang_cpu, "_probe", lambda _p: "0.5.23 2.13.0+cpu")
    monkeypatch.setattr(sglang_cpu, "_run", lambda *a, **k: pytest.fail(f"pip ran: {a}"))
    assert sglang_cpu.install_sglang(tmp_path) == python
    assert sglang_cpu.sglang_home(tmp_path) == tmp_path / "sglang-cpu"


def test_a_venv_on_another_torch_build_is_made_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A venv on PyPI's CUDA torch (4 GB of libraries a CPU never calls) is removed whole and rebuilt on
    the CPU build: pip cannot swap the CUDA build's libraries out in place."""
    python = sglang_cpu.sglang_python(tmp_path)
    python.parent.mkdir(parents=True)
    python.write_text("")
    venv = python.parent.parent
    (venv / "lib-of-the-cuda-build").write_text("x")
    (venv / "openenv-sglang.json").write_text(json.dumps({"sglang": sglang_cpu.SGLANG_VERSION,
                                                          "torch": "2.14.1+cu130"}))
    steps: list[str] = []

    class Rebuilt(Exception):
        pass

    def run(cmd: list[str], what: str) -> None:
        steps.append(what)
        raise Rebuilt

    monkeypatch.setattr(sglang_cpu, "_run", run)
    monkeypatch.setattr(sglang_cpu, "_probe", lambda _p: pytest.fail("a venv on another torch was probed as usable"))
    monkeypatch.setattr(sglang_cpu.shutil, "which", lambda _name: "/bin/false-python3.11")
    messages: list[str] = []
    with pytest.raises(Rebuilt):
        sglang_cpu.install_sglang(tmp_path, messages.append)
    assert not (venv / "lib-of-the-cuda-build").exists()
    assert steps == ["creating the SGLang venv"]
    assert messages[0] == f"replacing the SGLang venv's torch 2.14.1+cu130 with {sglang_cpu.TORCH_VERSION}"


def test_the_venv_installs_the_cpu_torch_build_and_no_torchvision_from_the_registry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python = sglang_cpu.sglang_python(tmp_path)
    python.parent.mkdir(parents=True)
    python.write_text("")  # an interrupted install: the venv exists, no marker
    (tmp_path / "vllm-venv" / "lib").mkdir(parents=True)  # the vLLM venv, installed before
    commands: list[list[str]] = []
    monkeypatch.setattr(sglang_cpu, "_run", lambda cmd, what: commands.append(cmd))
    monkeypatch.setattr(sglang_cpu, "_install_standins", lambda _p: None)
    shares: list[tuple[Path, Path, int]] = []

    def share(target: Path, source: Path) -> Shared:
        shares.append((target, source, len(commands)))
        return Shared(0, 0)

    monkeypatch.setattr(shared_files, "share_identical_files", share)

    class Done:
        returncode = 0
        stdout = "0.5.23 2.13.0+cpu\n"

    monkeypatch.setattr(sglang_cpu.subprocess, "run", lambda *a, **k: Done())
    assert sglang_cpu.install_sglang(tmp_path) == python
    assert commands[0][-1] == "torch==2.13.0+cpu"
    installed = " ".join(" ".join(c) for c in commands)
    assert "torchvision" not in installed and "torch==2.14" not in installed
    marker = json.loads((python.parent.parent / "openenv-sglang.json").read_text())
    assert marker == {"sglang": "0.5.23", "torch": "2.13.0+cpu"}
    # what it holds the same as the vLLM venv is shared after torch, and after the requirements
    venv = python.parent.parent
    assert shares == [(venv / "lib", tmp_path / "vllm-venv" / "lib", 1), (venv / "lib", tmp_path / "vllm-venv" / "lib", 2)]
