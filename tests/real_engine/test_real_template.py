"""The recorder's template fingerprint of the real vLLM equals the trainer-side helper's, computed
from the real Qwen2.5 tokenizer and chat template (the folder vLLM serves, read by transformers)."""

from __future__ import annotations

import pytest

from conftest import RealStack
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
