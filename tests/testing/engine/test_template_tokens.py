"""A template family's control markers, read off the template and registered as special tokens: each
marker becomes one id, so turn boundaries tokenize as in the family's own tokenizer."""

from __future__ import annotations

from pathlib import Path

from openenv_harness.testing.engine import EngineConfig, EngineServer
from openenv_harness.testing.engine.template_tokens import template_engine_config, template_special_tokens
from openenv_harness.testing.engine.tokenizer import reference_tokenizer

LLAMA_LIKE = ("{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
              "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def test_the_markers_of_each_family_shape_are_found_once_in_order() -> None:
    source = LLAMA_LIKE + " <｜end▁of▁sentence｜> <|turn> <turn|> <start_of_turn> [gMASK]<sop> <|eot_id|> <b>text</b>"
    assert template_special_tokens(source) == [
        "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<｜end▁of▁sentence｜>", "<|turn>", "<turn|>",
        "<start_of_turn>", "[gMASK]", "<sop>"]
    assert template_special_tokens("{{ messages[0].content }}") == []


def test_registered_markers_are_one_id_each_and_do_not_merge_across_turns() -> None:
    plain, family = reference_tokenizer(), reference_tokenizer(("<|eot_id|>", "<|start_header_id|>"))
    text = "hi<|eot_id|><|start_header_id|>user"
    assert len(plain.encode("<|eot_id|>")) > 1  # plain text under the base BPE
    ids = family.encode(text)
    assert family.atomic_id("<|eot_id|>") in ids and family.atomic_id("<|start_header_id|>") in ids
    assert family.decode(ids) == text
    assert reference_tokenizer() is plain  # the base tokenizer is untouched


def test_the_engine_serves_a_template_with_its_own_markers(tmp_path: Path) -> None:
    template = tmp_path / "llama_like.jinja"
    template.write_text(LLAMA_LIKE)
    config = template_engine_config(template, None)
    assert config.added_special_tokens == ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    import httpx

    body = {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}
    with EngineServer(config) as engine, EngineServer(EngineConfig(chat_template=template)) as plain:
        ids = httpx.post(f"{engine.url}/tokenize", json=body).json()["tokens"]
        plain_ids = httpx.post(f"{plain.url}/tokenize", json=body).json()["tokens"]
    assert len(ids) < len(plain_ids)  # each marker one id
    eot = reference_tokenizer(tuple(config.added_special_tokens)).atomic_id("<|eot_id|>")
    assert eot is not None and ids.count(eot) == 1
