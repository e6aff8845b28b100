"""The reference tokenizer: a real, deterministic byte-level BPE."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given, settings
from tokenizers import Tokenizer
from hypothesis import strategies as st

from openenv_harness.testing.engine.policy import noncanonical_ids
from openenv_harness.testing.engine.tokenizer import (
    ADDED_TOKENS,
    IM_END,
    SPECIAL_TOKENS,
    build_reference_tokenizer,
    is_noncanonical,
    reference_tokenizer,
)

_FINGERPRINT_SCRIPT = """
import time
from openenv_harness.testing.engine.tokenizer import build_reference_tokenizer
t = time.perf_counter()
tok = build_reference_tokenizer()
print(tok.fingerprint(), time.perf_counter() - t)
"""


def test_same_vocabulary_and_ids_in_another_process() -> None:
    here = reference_tokenizer()
    out = subprocess.run([sys.executable, "-c", _FINGERPRINT_SCRIPT], capture_output=True, text=True, check=True)
    fingerprint, seconds = out.stdout.split()
    assert fingerprint == here.fingerprint()
    assert float(seconds) < 1.5, "training the tokenizer must stay well under a second or so"


def test_building_twice_gives_identical_tokenizers() -> None:
    first, second = build_reference_tokenizer(), build_reference_tokenizer()
    assert first.to_json() == second.to_json()
    text = 'I will run {"command": "ls -la"} and read README.md.'
    assert first.encode(text) == second.encode(text)


def test_vocabulary_size_and_atomic_markup_tokens() -> None:
    tok = reference_tokenizer()
    assert 2000 <= tok.vocab_size <= 4100
    for token in SPECIAL_TOKENS + ADDED_TOKENS:
        assert tok.encode(token) == [tok.token_id(token)], token
    ids = tok.encode("<|im_start|>assistant\n<think>\nhm\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>")
    assert tok.token_id("<think>") in ids and tok.token_id("</tool_call>") in ids


def test_common_words_and_json_punctuation_have_merges() -> None:
    tok = reference_tokenizer()
    assert len(tok.encode(" the command")) == 2
    assert len(tok.encode('{"command": "ls"}')) < len('{"command": "ls"}') / 2


def test_decode_round_trips_and_skips_only_control_tokens() -> None:
    tok = reference_tokenizer()
    text = "héllo wörld ☃ 日本語 <tool_call>x</tool_call>"
    ids = tok.encode(text + IM_END)
    assert tok.decode(ids) == text + IM_END
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert b"".join(tok.token_bytes[i] for i in ids) == (text + IM_END).encode()


def test_multibyte_characters_straddle_tokens() -> None:
    tok = reference_tokenizer()
    ids = tok.encode("☃")
    assert len(ids) > 1, "a rare 3-byte character is split into byte tokens"
    assert tok.token_texts[ids[0]] == "\ufffd"


def test_noncanonical_segmentation_decodes_equal_but_encodes_differently() -> None:
    tok = reference_tokenizer()
    text = "I will run the command and check the output."
    canonical = tok.encode(text)
    resegmented = noncanonical_ids(tok, canonical)
    assert resegmented != canonical and len(resegmented) > len(canonical)
    assert tok.decode(resegmented) == text
    assert tok.encode(text) == canonical
    assert is_noncanonical(tok, resegmented)
    assert not is_noncanonical(tok, canonical)


def test_split_parts_are_shorter_vocabulary_tokens() -> None:
    tok = reference_tokenizer()
    token_id = tok.encode(" command")[0]
    parts = tok.split(token_id)
    assert parts is not None
    assert b"".join(tok.token_bytes[p] for p in parts) == tok.token_bytes[token_id]
    assert all(len(tok.token_bytes[p]) < len(tok.token_bytes[token_id]) for p in parts)
    assert tok.split(tok.im_end_id) is None


_PIECES = st.sampled_from(["<|im_start|>", "<|im_end|>", "<tool_call>", "</think>", "\n", "\n\n", " ", "  ",
                           "assistant", "hello", " world", '{"a": 1}', "é", "☃", "<|im", "tool_call>"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(_PIECES, st.text(max_size=12)), max_size=12))
def test_piecewise_encoding_equals_whole_text_encoding(parts: list[str]) -> None:
    tok = reference_tokenizer()
    text = "".join(parts)
    assert tok.encode(text) == tok.tokenizer.encode(text, add_special_tokens=False).ids


def test_render_and_encode_of_a_long_prompt_is_fast() -> None:
    import time

    from openenv_harness.testing.engine.template import reference_template

    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "Does things. " * 40,
                                               "parameters": {"type": "object"}}} for i in range(10)]
    messages = [{"role": "system", "content": "You are a coding agent. " * 200},
                {"role": "user", "content": "Fix the bug in main.py, please."}]
    template, tok = reference_template(), reference_tokenizer()
    tok.encode(template.render(messages, tools, add_generation_prompt=True))  # warm the piece cache
    messages.append({"role": "assistant", "content": "Reading it now, one moment."})
    messages.append({"role": "user", "content": "line 1: value = 3 # step 1\n" * 60})
    started = time.perf_counter()
    ids = tok.encode(template.render(messages, tools, add_generation_prompt=True))
    elapsed = time.perf_counter() - started
    assert len(ids) > 2000
    assert elapsed < 0.1, f"render + encode took {elapsed * 1000:.1f} ms"


def test_the_real_qwen_tokenizer_loads_from_the_model_folder(qwen_folder) -> None:
    from openenv_harness.testing.engine.tokenizer import hf_tokenizer

    tok = hf_tokenizer(qwen_folder)
    assert tok is hf_tokenizer(qwen_folder / "tokenizer.json"), "loaded once"
    assert tok.encode("hello world") == [14990, 1879]  # what the real vLLM's /tokenize says
    assert tok.vocab_string(1879) == "Ġworld" and tok.token_texts[1879] == " world"
    assert (tok.im_end_id, tok.token_id("<tool_call>"), tok.token_id("</tool_call>")) == (151645, 151657, 151658)
    assert tok.im_end_id in tok.special_ids and tok.token_id("<tool_call>") not in tok.special_ids
    assert tok.encode("<tool_call>\n{}</tool_call><|im_end|>")[0] == 151657
    assert tok.decode(tok.encode("héllo ☃ <|im_end|>"), skip_special_tokens=True) == "héllo ☃ "
    assert tok.vocab_size == 151936


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(_PIECES, st.text(max_size=12)), max_size=12))
def test_piecewise_encoding_equals_whole_text_encoding_for_the_real_tokenizer(parts: list[str]) -> None:
    from openenv_harness.engine import engine_home, prepared_model_dir
    from openenv_harness.testing.engine.tokenizer import hf_tokenizer

    folder = prepared_model_dir(engine_home())
    assert folder is not None, "the real model is not installed: run ./dev setup"
    tok = hf_tokenizer(folder)
    text = "".join(parts)
    assert tok.encode(text) == tok.tokenizer.encode(text, add_special_tokens=False).ids


def test_a_tokenizer_that_is_not_byte_level_is_refused(tmp_path) -> None:
    import pytest
    from tokenizers import models

    from openenv_harness.testing.engine.tokenizer import hf_tokenizer

    words = Tokenizer(models.WordLevel({"hello": 0, "日本": 1, "[UNK]": 2}, unk_token="[UNK]"))
    words.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match="only byte-level BPE"):
        hf_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError):
        hf_tokenizer(tmp_path / "missing")
