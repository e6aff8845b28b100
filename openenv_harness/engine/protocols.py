"""vLLM releases newer than the CPU build, as source: their own request and reply models, importable on CPU.

GPU users run vLLM 0.33 / 0.34; no CPU build of them exists. Their wire format is defined by pydantic
models in pure Python (``vllm.entrypoints.openai.chat_completion.protocol``,
``vllm.entrypoints.scale_out.token_in_token_out.protocol``), which import on CPU with the engine
venv's dependencies once the release's Python files come first on the path. ``ensure_protocols``
downloads each release's wheel (``pip download --no-deps``: data, never installed), keeps only its
``.py`` and ``.json`` files under ``<engine home>/protocols/<version>/`` and drops the wheel; the
conformance tests then build and check replies and requests with the release's own classes.

SGLang 0.5.23 is held to its own classes the same way (``ensure_sglang_sources``): its wheel's ``sglang/**``
Python and JSON files land under ``<engine home>/protocols/sglang-0.5.23/``. Its request models
(``sglang.srt.entrypoints.openai.protocol``, ``sglang.srt.managers.io_struct``) import on CPU with the
engine venv's torch, transformers, pydantic and msgspec plus three pure-Python or prebuilt packages that
venv lacks (``SGLANG_CHECK_DEPS``), installed without their dependencies into
``protocols/sglang-0.5.23-deps/`` (a ``--target`` folder put on ``PYTHONPATH`` after the sources) so the
engine venv itself stays exactly what vLLM pinned.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from openenv_harness.engine.setup import EngineSetupError, engine_home

#: the releases held to their own models beside the installed 0.32 (``VLLM_VERSION``)
PROTOCOL_RELEASES = ("0.33.0", "0.34.0")
_KEEP = (".py", ".json")
#: the SGLang release the reference engine's SGLang flavour speaks and the conformance check imports
SGLANG_RELEASE = "0.5.23"
#: what SGLang's protocol and io_struct modules import that the engine venv lacks (found by importing them
#: there): orjson (``sglang.srt.utils.common``), IPython and traitlets (``sglang.utils``); pinned, no deps
SGLANG_CHECK_DEPS = ("orjson==3.13.0", "ipython==9.19.1", "traitlets==5.16.1")
_MARKER = ".complete"


def protocol_dir(version: str, home: Path | None = None) -> Path:
    return (home or engine_home()) / "protocols" / version


def protocol_path(version: str, home: Path | None = None) -> Path | None:
    """The folder to put first on ``PYTHONPATH`` for ``version``'s models; None where it is not fetched."""
    folder = protocol_dir(version, home)
    return folder if (folder / _MARKER).is_file() else None


def ensure_protocols(versions: tuple[str, ...] = PROTOCOL_RELEASES, home: Path | None = None,
                     progress: Callable[[str], None] = lambda _m: None) -> dict[str, Path]:
    """Each release's Python sources, fetched once (idempotent); raises ``EngineSetupError`` with pip's reason."""
    out: dict[str, Path] = {}
    for version in versions:
        folder = protocol_dir(version, home)
        if not (folder / _MARKER).is_file():
            progress(f"fetching vLLM {version}'s Python sources (its request and reply models; the wheel is dropped)")
            _fetch(version, folder)
        out[version] = folder
    return out


def _fetch(version: str, folder: Path) -> None:
    _fetch_wheel("vllm", version, folder)


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()
             and not ln.startswith("WARNING: Location")]
    return lines[-1] if lines else "no output"


def _fetch_wheel(package: str, version: str, folder: Path, keep_dirs: bool = False) -> None:
    """``package==version``'s wheel, as data: its ``<package>/`` .py and .json files extracted to ``folder``;
    ``keep_dirs``: every folder of the package too, empty where it held no such file (SGLang's kernel
    package checks at import that its ``include`` and ``csrc`` folders exist)."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{package}=={version}",
                               "-d", tmp], capture_output=True, text=True)
        wheels = list(Path(tmp).glob(f"{package}-*.whl"))
        if done.returncode != 0 or not wheels:
            reason = _last_line(done) if done.returncode != 0 else "no wheel"
            raise EngineSetupError(f"pip download {package}=={version} failed: {reason}")
        folder.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in wheel.namelist():
                if name.startswith(f"{package}/") and name.endswith(_KEEP):
                    wheel.extract(name, folder)
                elif keep_dirs and name.startswith(f"{package}/"):
                    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / _MARKER).write_text(version + "\n")


def sglang_protocol_dir(home: Path | None = None) -> Path:
    return (home or engine_home()) / "protocols" / f"sglang-{SGLANG_RELEASE}"


def sglang_deps_dir(home: Path | None = None) -> Path:
    return (home or engine_home()) / "protocols" / f"sglang-{SGLANG_RELEASE}-deps"


def sglang_protocol_path(home: Path | None = None) -> Path | None:
    """The folder to put first on ``PYTHONPATH`` for SGLang's models; None where it is not fetched."""
    folder = sglang_protocol_dir(home)
    return folder if (folder / _MARKER).is_file() else None


def sglang_deps_path(home: Path | None = None) -> Path | None:
    """The ``--target`` folder of ``SGLANG_CHECK_DEPS``; None where it is not installed."""
    folder = sglang_deps_dir(home)
    return folder if (folder / _MARKER).is_file() else None


def ensure_sglang_sources(python: Path, home: Path | None = None,
                  progress: Callable[[str], None] = lambda _m: None) -> tuple[Path, Path]:
    """SGLang's sources and the few packages its models need beside the engine venv (``python``), each
    fetched once; ``(sources, deps)``. Raises ``EngineSetupError`` with pip's reason."""
    sources, deps = sglang_protocol_dir(home), sglang_deps_dir(home)
    if not (sources / _MARKER).is_file():
        progress(f"fetching SGLang {SGLANG_RELEASE}'s Python sources (its request and reply models; the wheel "
                 "is dropped)")
        _fetch_wheel("sglang", SGLANG_RELEASE, sources, keep_dirs=True)
    if not (deps / _MARKER).is_file():
        if not python.is_file():
            raise EngineSetupError(f"SGLang's models import with the engine venv ({python}), which is not "
                                   "installed: run python -m openenv_harness.engine setup first")
        progress(f"installing {', '.join(SGLANG_CHECK_DEPS)} beside the engine venv, for SGLang's models")
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target",
                               str(deps), *SGLANG_CHECK_DEPS], capture_output=True, text=True)
        if done.returncode != 0:
            raise EngineSetupError(f"pip install {' '.join(SGLANG_CHECK_DEPS)} failed: {_last_line(done)}")
        (deps / _MARKER).write_text(" ".join(SGLANG_CHECK_DEPS) + "\n")
    return sources, deps
