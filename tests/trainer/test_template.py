"""The trainer's template fingerprint equals the recorder's probe of an engine serving that template."""

from __future__ import annotations

import copy

import pytest

from openenv_harness.recorder import RecorderAPIError
from openenv_harness.recorder.engine_knowledge.provenance import PROBES
from openenv_harness.testing.engine import EngineConfig, reference_template, reference_tokenizer
from openenv_harness.trainer import TemplateFingerprintError, engine_view, probe_token_ids, template_fingerprint

pytest.importorskip("transformers")  # the trainer's tokenizer (the [trainer] extra)


def _served_fingerprint(stack) -> str:
    engine = stack.admin.health()["engine"]
    assert engine["template_status"] == "probed"
    return engine["template_fingerprint"]


def test_fingerprint_matches_the_recorders_probe_for_each_tool_argument_convention(make_stack, hf_tokenizer) -> None:
    tok = hf_tokenizer()
    verbatim = _served_fingerprint(make_stack(EngineConfig(tool_arguments="verbatim")))
    parsed = _served_fingerprint(make_stack(EngineConfig(tool_arguments="parsed")))
    # the probe has a string tool-call argument: parsing it changes the rendering, so the two differ
    assert verbatim != parsed
    assert template_fingerprint(tok, parse_tool_arguments=False) == verbatim
    assert template_fingerprint(tok, parse_tool_arguments=True) == parsed  # what vLLM does
    assert template_fingerprint(tok) == parsed  # the default follows vLLM


def test_probe_ids_are_the_engines_ids(make_stack, hf_tokenizer) -> None:
    stack = make_stack()
    ids = probe_token_ids(hf_tokenizer(), parse_tool_arguments=False)
    assert len(ids) == len(PROBES)
    tok = reference_tokenizer()
    for probe, probe_ids in zip(PROBES, ids):
        text = reference_template().render(probe["messages"], probe.get("tools"), probe["add_generation_prompt"])
        assert probe_ids == tok.encode(text)
        assert all(type(i) is int for i in probe_ids)
    assert stack.engine.info()["template_sha256"] == reference_template().sha256


def test_explicit_template_overrides_the_tokenizers(hf_tokenizer) -> None:
    served = reference_template().source
    edited = served.replace("# Tools", "## Tools")
    assert edited != served
    tok = hf_tokenizer(chat_template=edited)
    assert template_fingerprint(tok) != template_fingerprint(hf_tokenizer())
    assert template_fingerprint(tok, chat_template=served) == template_fingerprint(hf_tokenizer())


def test_recorder_verifies_a_matching_trainer_and_refuses_a_different_template(make_stack, hf_tokenizer) -> None:
    stack = make_stack(EngineConfig(tool_arguments="parsed"))
    good = template_fingerprint(hf_tokenizer())
    created = stack.admin.create_session(trainer_template_fingerprint=good)
    assert created["template_status"] == "verified"
    other = template_fingerprint(hf_tokenizer(chat_template=reference_template().source.replace("# Tools", "## Tools")))
    with pytest.raises(RecorderAPIError) as err:
        stack.admin.create_session(trainer_template_fingerprint=other)
    assert err.value.status == 409
    assert other in err.value.message and good in err.value.message


def test_engine_view_parses_tool_arguments_like_vllm_and_leaves_the_probes_alone() -> None:
    before = copy.deepcopy(PROBES)
    view = engine_view(PROBES[1]["messages"])
    assert view[2]["tool_calls"][0]["function"]["arguments"] == {"command": "ls"}
    assert PROBES == before
    assert engine_view(PROBES[1]["messages"], parse_tool_arguments=False) == PROBES[1]["messages"]
    empty = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": ""}}]}]
    assert engine_view(empty)[0]["tool_calls"][0]["function"]["arguments"] == {}


def test_bad_input_is_a_clear_error(hf_tokenizer) -> None:
    tok = hf_tokenizer()
    tok.chat_template = None
    with pytest.raises(TemplateFingerprintError, match="no chat template"):
        template_fingerprint(tok)
    broken = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]
    with pytest.raises(TemplateFingerprintError, match="not JSON"):
        engine_view(broken)
    with pytest.raises(TemplateFingerprintError, match="cannot render"):
        template_fingerprint(hf_tokenizer(), chat_template="{{ raise_exception('no tools here') }}")
