"""The trainer's side of the served-template check (D3): the fingerprint of the template it trains with.

The recorder never renders, so it cannot compare templates by reading them. Instead it sends fixed
probe conversations (``openenv_harness.recorder.engine_knowledge.provenance.PROBES``) through the engine's
``/tokenize`` and hashes the ids that come back. This module renders the *same* probes with the
trainer's own ``transformers`` tokenizer and hashes them the same way. Equal fingerprints mean the
engine's prompt ids and the trainer's agree on every probe -- template text, template kwargs and
tokenizer together, which a hash of the template text alone cannot promise.

Pass the result as ``trainer_template_fingerprint`` (``TRLSessionFactory`` / ``HarnessSessionFactory``):
session creation then fails with HTTP 409 when the engine serves something else.

One preprocessing step must match the engine's: vLLM ``json.loads`` string tool-call arguments
into objects before it renders a conversation, so a template sees a mapping there, not the
agent's string. ``parse_tool_arguments=True`` (the default) does the same here; engines that
render the string verbatim (the reference engine's default) need ``False``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from openenv_harness.recorder.engine_knowledge.provenance import PROBES, fingerprint_ids


class TemplateFingerprintError(ValueError):
    """The tokenizer cannot render the probe conversations (no template, or the template rejects them)."""


def engine_view(messages: list[dict[str, Any]], *, parse_tool_arguments: bool = True) -> list[dict[str, Any]]:
    """The messages as the engine hands them to its template (copies; the probes are never mutated).

    With ``parse_tool_arguments``, string tool-call arguments become objects, as vLLM does; an
    empty string becomes ``{}``. Arguments that are not JSON raise ``TemplateFingerprintError``
    (vLLM answers those with a 400, so no fingerprint exists for them).
    """
    prepared = copy.deepcopy(messages)
    if not parse_tool_arguments:
        return prepared
    for message in prepared:
        for call in message.get("tool_calls") or []:
            function = call.get("function")
            if not isinstance(function, dict):
                continue
            arguments = function.get("arguments")
            if not arguments:
                function["arguments"] = {}
            elif isinstance(arguments, str):
                try:
                    function["arguments"] = json.loads(arguments)
                except json.JSONDecodeError as exc:
                    raise TemplateFingerprintError(f"tool-call arguments are not JSON: {exc}") from None
    return prepared


def _as_ids(rendered: Any) -> list[int]:
    """``apply_chat_template(tokenize=True)`` returns ids, or a mapping holding them (transformers 5)."""
    if isinstance(rendered, Mapping):
        rendered = rendered["input_ids"]
    if hasattr(rendered, "tolist"):
        rendered = rendered.tolist()
    ids = list(rendered)
    if ids and isinstance(ids[0], list):  # a batch of one
        if len(ids) != 1:
            raise TemplateFingerprintError(f"expected one rendered conversation, got a batch of {len(ids)}")
        ids = ids[0]
    return [int(i) for i in ids]


def probe_token_ids(
    tokenizer: Any,
    *,
    chat_template: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    parse_tool_arguments: bool = True,
) -> list[list[int]]:
    """The ids the trainer's tokenizer gives each probe conversation, in probe order.

    ``tokenizer`` is any ``transformers`` tokenizer with ``apply_chat_template``. ``chat_template``
    overrides the tokenizer's own (pass the one you serve with vLLM ``--chat-template``);
    ``chat_template_kwargs`` are the kwargs the engine renders with (e.g. ``enable_thinking``).
    """
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise TemplateFingerprintError("the tokenizer has no chat template; pass chat_template= or set one")
    kwargs = dict(chat_template_kwargs or {})
    ids: list[list[int]] = []
    for probe in PROBES:
        messages = engine_view(probe["messages"], parse_tool_arguments=parse_tool_arguments)
        try:
            rendered = tokenizer.apply_chat_template(
                messages,
                tools=probe.get("tools"),
                add_generation_prompt=probe["add_generation_prompt"],
                tokenize=True,
                return_dict=False,
                chat_template=chat_template,
                **kwargs,
            )
        except TemplateFingerprintError:
            raise
        except Exception as exc:  # jinja2.TemplateError, ValueError, TypeError from arbitrary templates
            raise TemplateFingerprintError(f"the chat template cannot render probe conversations: {exc}") from exc
        ids.append(_as_ids(rendered))
    return ids


def template_fingerprint(
    tokenizer: Any,
    *,
    chat_template: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    parse_tool_arguments: bool = True,
) -> str:
    """The fingerprint the recorder would compute for an engine serving this tokenizer and template."""
    return fingerprint_ids(
        probe_token_ids(
            tokenizer,
            chat_template=chat_template,
            chat_template_kwargs=chat_template_kwargs,
            parse_tool_arguments=parse_tool_arguments,
        )
    )
