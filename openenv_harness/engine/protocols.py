"""vLLM releases newer than the CPU build, as source: their own request and reply models, importable on CPU.

GPU users run vLLM 0.33 / 0.34; no CPU build of them exists. Their wire format is defined by pydantic
models in pure Python (``vllm.entrypoints.openai.chat_completion.protocol``,
``vllm.entrypoints.scale_out.token_in_token_out.protocol``), which import on CPU with the engine
venv's dependencies once the release's Python files come first on the path. ``ensure_protocols``
downloads each release's wheel (``pip download --no-deps``: data, never installed), keeps only its
``.py`` and ``.json`` files under ``<engine home>/protocols/<version>/`` and drops the wheel; the
conformance tests then build and check replies and requests with the release's own classes.
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
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"vllm=={version}",
                               "-d", tmp], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("vllm-*.whl"))
        if done.returncode != 0 or not wheels:
            lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()
                     and not ln.startswith("WARNING: Location")]
            raise EngineSetupError(f"pip download vllm=={version} failed: {lines[-1] if lines else 'no wheel'}")
        folder.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in wheel.namelist():
                if name.startswith("vllm/") and name.endswith(_KEEP):
                    wheel.extract(name, folder)
    (folder / _MARKER).write_text(version + "\n")
