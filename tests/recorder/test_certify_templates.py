"""TRL 1.16's own templates, served by the reference engine with the real Qwen2.5 tokenizer and
certified as the recorder does it; the tool-prefix verdict is TRL's own check's.

Expected verdicts, and what they mean:
- qwen2_5, qwen3_training: certified.
- qwen3 (the original): fails tool_prefix and assistant_stable -- the last assistant turn carries an
  empty ``<think></think>`` block that disappears once a tool result follows it.
- qwen3_5_think and its training variant: fail the turn start -- the generation prompt ends in
  ``<think>\\n``, which a rendered assistant turn tokenizes together with what follows -- and keep the
  turn's end: exact in incremental mode only. The original also changes earlier turns across a user
  message, the training variant does not.
- llama3, gptoss: fail tool_prefix here. Served with the Qwen2.5 tokenizer their special markers are
  plain text, and adjacent markers merge into other tokens: the verdict is this template with this
  tokenizer's (TRL's check, on the same tokenizer, agrees), not with the family's own tokenizer.
The test fails, never skips, where the model folder is missing: ``./dev setup`` installs it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from openenv_harness.recorder.certify import certify_template
from openenv_harness.recorder.upstream.http import HTTPEngine
from openenv_harness.testing.engine import EngineConfig, EngineServer

pytestmark = pytest.mark.slow

EXPECTED: dict[str, dict[str, Any]] = {
    "qwen2_5.jinja": {"status": "certified", "exact_in": ["full_history", "incremental"]},
    "qwen3_training.jinja": {"status": "certified", "assistant_stable_across_user": True},
    "qwen3.jinja": {"status": "failed", "tool_prefix": False, "assistant_stable": False,
                    "assistant_stable_across_user": False},
    "qwen3_5_think.jinja": {"status": "failed", "turn_start": False, "junction": True, "tool_prefix": True,
                            "assistant_stable_across_user": False, "exact_in": ["incremental"]},
    "qwen3_5_think_training.jinja": {"status": "failed", "turn_start": False, "junction": True, "tool_prefix": True,
                                     "assistant_stable_across_user": True, "exact_in": ["incremental"]},
    "llama3.jinja": {"status": "failed", "tool_prefix": False},
    "gptoss.jinja": {"status": "failed", "tool_prefix": False},
}


def _folder() -> Path:
    from openenv_harness.engine import engine_home, prepared_model_dir

    folder = prepared_model_dir(engine_home())
    if folder is None:
        pytest.fail("the Qwen2.5 model folder is not installed: run ./dev setup", pytrace=False)
    return folder


def _template(name: str) -> Path:
    import trl

    path = Path(trl.__file__).parent / "chat_templates" / name
    assert path.is_file(), f"TRL {trl.__version__} ships no {name}"
    return path


async def _certify(url: str) -> Any:
    engine = HTTPEngine(url, timeout_s=60)
    await engine.start()
    try:
        return await certify_template(engine)
    finally:
        await engine.aclose()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_trl_templates_get_the_expected_verdicts(name: str) -> None:
    from transformers import AutoTokenizer
    from trl.chat_template_utils import is_chat_template_prefix_preserving

    folder, path = _folder(), _template(name)
    source = path.read_text()
    config = EngineConfig.for_model(folder, chat_template=path,
                                    tool_call_parser="qwen3_xml" if "<function=" in source else "hermes",
                                    reasoning_parser="think" if "<think>" in source else None)
    with EngineServer(config) as engine:
        cert = asyncio.run(_certify(engine.url))
    props = {p.name: p for p in cert.properties}
    expected = EXPECTED[name]
    assert cert.status == expected["status"], [(p.name, p.passed, p.detail) for p in cert.properties]
    assert cert.exact_in == expected.get("exact_in", cert.exact_in)
    for prop, passed in expected.items():
        if prop not in ("status", "exact_in"):
            assert props[prop].passed is passed, (prop, props[prop].detail, props[prop].expected, props[prop].found)
    for prop in cert.failed:  # every failure says where and what, in text
        assert prop.detail and (prop.at is not None or prop.name == "junction")
    # TRL's own tool-prefix check, on the same tokenizer and template, agrees with ours
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.chat_template = source
    assert is_chat_template_prefix_preserving(tokenizer) is props["tool_prefix"].passed
