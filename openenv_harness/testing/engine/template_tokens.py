"""A chat template family's own special tokens, read off the template's text.

Why: the reference engine certifies every template TRL ships with one real tokenizer (Qwen2.5's).
There another family's markers (``<|eot_id|>``, ``<|start|>``, ``<｜end▁of▁sentence｜>``) are plain
text that byte-level BPE merges across turn boundaries (``|>`` + ``<|`` -> ``><``), so a verdict
would be the tokenizer's, not the template's. In the family's own tokenizer each marker is one
special id. Registering the markers on the base BPE (``EngineConfig.added_special_tokens``) gives
the family's behaviour at the boundaries that certification probes -- the same tokenizer TRL's
``is_chat_template_prefix_preserving`` is then given, so both checks judge the same thing.

The markers are the shapes families use for control tokens: ``<|name|>`` (ChatML, Llama 3, gpt-oss,
Phi, Cohere, GLM, LFM), ``<｜name｜>`` (DeepSeek), one-sided ``<|name>`` / ``<name|>`` (Gemma 4),
``<start_of_turn>`` / ``<end_of_turn>`` (Gemma), ``[gMASK]`` / ``<sop>`` (GLM).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openenv_harness.testing.engine.config import EngineConfig

_MARKER = re.compile(
    r"<\|[^<>|\s]{1,48}\|>"  # <|eot_id|>, <|im_start|>, <|"|>
    r"|<｜[^<>｜]{1,48}｜>"  # <｜end▁of▁sentence｜>
    r"|<\|[A-Za-z_]{1,32}>|<[A-Za-z_]{1,32}\|>"  # <|turn>, <turn|>
    r"|<(?:start_of_turn|end_of_turn|sop|eop)>|\[gMASK\]")


def template_special_tokens(source: str) -> list[str]:
    """The control-token markers a template writes, in first-use order, each once."""
    return list(dict.fromkeys(_MARKER.findall(source)))


def template_engine_config(template: Path, folder: Path | None, **overrides: Any) -> "EngineConfig":
    """The reference engine serving ``template`` as its family would be served: the base tokenizer
    (a model folder; the built-in BPE without one) with the template's markers as special tokens,
    and the tool-call and reasoning parsers the template's format needs."""
    from openenv_harness.testing.engine.config import EngineConfig

    source = template.read_text()
    settings: dict[str, Any] = {
        "chat_template": template, "added_special_tokens": template_special_tokens(source),
        "tool_call_parser": "qwen3_xml" if "<function=" in source else "hermes",
        "reasoning_parser": "think" if "<think>" in source else None, **overrides}
    return EngineConfig.for_model(folder, **settings) if folder is not None else EngineConfig(**settings)


def trl_prefix_verdict(template: Path, folder: Path) -> bool | str:
    """TRL's own ``is_chat_template_prefix_preserving`` on the tokenizer the engine serves the template
    with (the folder's, the template's markers as special tokens): its verdict, or -- where the
    template refused TRL's probe -- the error in its words. Needs TRL and transformers."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import is_chat_template_prefix_preserving

    source = template.read_text()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    markers = template_special_tokens(source)
    if markers:
        tokenizer.add_tokens(markers, special_tokens=True)
    tokenizer.chat_template = source
    try:
        return bool(is_chat_template_prefix_preserving(tokenizer))
    except Exception as exc:  # any refusal of the template is the answer, in its words
        return f"{type(exc).__name__}: {exc}"
