"""TRL 1.16's own templates, served by the reference engine as their family would be served -- the
real Qwen2.5 tokenizer with the template's own control markers registered as special tokens
(``template_tokens``) -- and certified as the recorder does it; the tool-prefix verdict is compared
with TRL's own check on the same tokenizer, for every template TRL ships.

Expected verdicts, and what they mean:
- qwen2_5, qwen3_training, llama3, gptoss: certified (exact in both prompt modes). Under the Qwen2.5
  tokenizer alone, llama3's and gpt-oss's markers would be plain text that merges across turns
  (``|>`` + ``<|``): the verdict would be that tokenizer's, not the template's.
- qwen3 (the original): fails tool_prefix and assistant_stable -- the last assistant turn carries an
  empty ``<think></think>`` block that disappears once a tool result follows it.
- qwen3_5_think and its training variant: fail the turn start -- the generation prompt ends in
  ``<think>\\n``, which a rendered assistant turn tokenizes together with what follows -- and keep the
  turn's end: exact in incremental mode only. The original also changes earlier turns across a user
  message, the training variant does not.
The tests fail, never skip, where the model folder is missing: ``./dev setup`` installs it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from openenv_harness.recorder.engine_knowledge.certify import Certification, certify_template
from openenv_harness.recorder.upstream.http import HTTPEngine
from openenv_harness.testing.engine import EngineServer
from openenv_harness.testing.engine.template_tokens import template_engine_config, trl_prefix_verdict

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
    "llama3.jinja": {"status": "certified", "tool_prefix": True},
    "gptoss.jinja": {"status": "certified", "tool_prefix": True},
}

#: where TRL's check and ours do not give the same tool-prefix verdict, and why (each reason is
#: asserted below: TRL's own error, and what our certificate says instead)
TRL_RAISES_ROLES = "Conversation roles must alternate"  # its probe has a tool turn these templates refuse
TRL_RAISES_STRING_CONTENT = "str object has no element 0"  # it passes content as a string; the template wants parts
DISAGREEMENTS: dict[str, tuple[str, bool | None, str]] = {
    # (what TRL raises, our tool_prefix verdict, why they differ)
    **{name: (TRL_RAISES_ROLES, None, "both refuse the tool turn: the template refused our probe as well")
       for name in ("cohere.jinja", "cohere_training.jinja", "gemma.jinja", "gemma3.jinja", "gemma3_training.jinja",
                    "gemma_training.jinja")},
    # vision templates loop over content parts; the engine, like vLLM's chat route, gives string content to
    # such a template as text parts, so it renders and is judged; TRL's check hands it a string
    **{name: (TRL_RAISES_STRING_CONTENT, True, "the engine renders string content as parts, as vLLM does")
       for name in ("idefics3.jinja", "idefics3_training.jinja", "smolvlm.jinja", "smolvlm_training.jinja")},
    **{name: (TRL_RAISES_STRING_CONTENT, None, "the template refused our probe as well")
       for name in ("llava_next.jinja", "llava_next_training.jinja")},
}
#: templates that concatenate tool arguments as strings: an engine that parses them into objects before
#: templating (vLLM's chat route does) cannot render their tool turns at all, and the certificate says
#: so; with the arguments passed as strings (``tool_arguments="verbatim"``) they are judged as TRL judges
STRING_ARGUMENTS = ("deepseekv3.jinja",)


def _folder() -> Path:
    from openenv_harness.engine import engine_home, prepared_model_dir

    folder = prepared_model_dir(engine_home())
    if folder is None:
        pytest.fail("the Qwen2.5 model folder is not installed: run ./dev setup", pytrace=False)
    return folder


def _templates() -> list[Path]:
    import trl

    return sorted((Path(trl.__file__).parent / "chat_templates").glob("*.jinja"))


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


def _served(path: Path, **overrides: Any) -> Certification:
    with EngineServer(template_engine_config(path, _folder(), **overrides)) as engine:
        return asyncio.run(_certify(engine.url))


def _trl_verdict(path: Path) -> bool | str:
    """TRL's own check on the same tokenizer: the Qwen2.5 one with the template's markers as special tokens."""
    return trl_prefix_verdict(path, _folder())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_trl_templates_get_the_expected_verdicts(name: str) -> None:
    cert = _served(_template(name))
    props = {p.name: p for p in cert.properties}
    expected = EXPECTED[name]
    assert cert.status == expected["status"], [(p.name, p.passed, p.detail) for p in cert.properties]
    assert cert.exact_in == expected.get("exact_in", cert.exact_in)
    for prop, passed in expected.items():
        if prop not in ("status", "exact_in"):
            assert props[prop].passed is passed, (prop, props[prop].detail, props[prop].expected, props[prop].found)
    for prop in cert.failed:  # every failure says where and what, in text
        assert prop.detail and (prop.at is not None or prop.name == "junction")


@pytest.mark.parametrize("path", _templates(), ids=lambda p: p.name)
def test_every_templates_tool_prefix_verdict_is_trls_or_the_difference_is_explained(path: Path) -> None:
    ours = {p.name: p for p in _served(path).properties}["tool_prefix"]
    theirs = _trl_verdict(path)
    if path.name in STRING_ARGUMENTS:
        # vLLM's form (arguments as objects) is refused, with the template's own words; as strings, TRL's verdict
        assert ours.passed is None and "str" in ours.detail and "dict" in ours.detail, ours.detail
        ours = {p.name: p for p in _served(path, tool_arguments="verbatim").properties}["tool_prefix"]
    if path.name in DISAGREEMENTS:
        raised, verdict, _why = DISAGREEMENTS[path.name]
        assert isinstance(theirs, str) and raised in theirs, theirs
        assert ours.passed is verdict, (ours.passed, ours.detail)
        if verdict is None:
            assert "refused" in ours.detail
    else:
        assert ours.passed is theirs, (path.name, ours.detail, ours.expected, ours.found, theirs)
