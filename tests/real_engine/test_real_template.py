"""The recorder's template fingerprint of the real vLLM equals the trainer-side helper's, computed
from the real Qwen2.5 tokenizer and chat template (the folder vLLM serves, read by transformers)."""

from __future__ import annotations

import pytest

from real_stack import RealStack
from openenv_harness.engine import VLLMServer
from openenv_harness.trainer import template_fingerprint

pytestmark = [pytest.mark.real_engine]


def test_trainer_fingerprint_equals_the_recorders_probe(vllm: VLLMServer, stack: RealStack) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(vllm.settings.model_dir))
    served = stack.admin.health()["engine"]
    assert served["template_status"] == "probed"
    assert template_fingerprint(tokenizer) == served["template_fingerprint"]
    created = stack.admin.create_session(trainer_template_fingerprint=template_fingerprint(tokenizer))
    assert created["template_status"] == "verified"


def test_the_real_template_is_certified_and_the_report_says_what_it_does(stack: RealStack) -> None:
    """Qwen2.5's own template on vLLM 0.32: prefix-preserving, no reasoning rendered, the turn ends
    with <|im_end|> and a newline, tool arguments re-spaced but kept in order; tool calls open with
    the special <tool_call> id."""
    engine = stack.admin.health()["engine"]
    cert = engine["template_certification"]
    assert cert["status"] == "certified" and cert["failed"] == []
    assert cert["probed_via"] == "render"  # the shared vLLM serves --enable-scale-out: the chat route's rendering
    props = cert["properties"]
    assert props["tool_prefix"] and props["assistant_stable"] and props["junction"] and props["content_parts"]
    assert props["tool_args_roundtrip"] is False  # spacing normalized, key order kept: informational
    created = stack.admin.create_session(require_exact_template=True)
    assert created["template_certification"]["status"] == "certified"
    records_cert = created["template_certification"]
    assert records_cert == cert
