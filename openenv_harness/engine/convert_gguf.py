"""Dequantize a GGUF checkpoint once into a plain Hugging Face folder vLLM can serve.

Run by the *engine's* interpreter (its own venv, with torch, transformers, gguf and safetensors),
as a script: ``python convert_gguf.py GGUF_FILE OUT_DIR``. It imports nothing of openenv-harness,
whose dependencies that venv does not carry.

Why a conversion and not the GGUF itself: vLLM 0.32 moved GGUF loading into a plugin that its CPU
build does not ship, while a bf16 safetensors folder loads with no plugin at all. transformers can
read the GGUF (weights, config, tokenizer and chat template) but refuses ``save_pretrained`` on a
GGUF-loaded model, so the config and the state dict are written here directly.

The folder is written under a temporary name and renamed at the end: a half-written conversion is
never taken for a finished one.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def convert(gguf_file: Path, out_dir: Path, generation: dict) -> None:
    """``generation``: the model's published generation config (a GGUF does not carry it)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    kwargs = {"gguf_file": gguf_file.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, dtype=torch.bfloat16, **kwargs)
    config = model.config
    state = model.state_dict()
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)  # tied: vLLM re-ties it to the embedding on load
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config_dict = config.to_dict()
    config_dict.pop("quantization_config", None)  # the weights written here are plain bf16
    config_dict["dtype"] = "bfloat16"
    (tmp / "config.json").write_text(json.dumps(config_dict, indent=2, default=str))
    tokenizer.save_pretrained(str(tmp))
    (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2))
    (tmp / "conversion.json").write_text(json.dumps({"from": gguf_file.name, "dtype": "bfloat16"}))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: python convert_gguf.py GGUF_FILE OUT_DIR GENERATION_CONFIG_JSON")
    convert(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), json.loads(sys.argv[3]))
