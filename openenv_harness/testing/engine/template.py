"""Rendering chat messages to the reference engine's prompt text.

Why our own template, rendered the way ``transformers.apply_chat_template`` renders: the recorder
must never render, but the tests around it need an engine whose prompt ids behave like a real
model's -- including a template that is token-level prefix-preserving, so that a clean agent
chain really is clean. The template lives in ``chat_template.jinja`` next to this module; its
sha256 is the "served template fingerprint" a recorder can report.

``prepare_messages`` is the step vLLM performs before templating (dropping empty ``tool_calls``
and, optionally, parsing string tool arguments into objects).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")
ASSISTANT_HEADER = "<|im_start|>assistant\n"
TURN_END = "<|im_end|>"

#: How string tool-call arguments in requests reach the template. ``verbatim`` keeps the agent's
#: string as sent; ``parsed`` does what vLLM does (``json.loads`` into an object, then ``tojson``).
ToolArguments = Literal["verbatim", "parsed"]


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """``tojson`` as chat templates expect it: no HTML escaping, no key sorting, unicode kept."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


class ChatTemplate:
    """A compiled chat template plus its fingerprint."""

    def __init__(self, source: str | None = None) -> None:
        self.source = source if source is not None else TEMPLATE_PATH.read_text(encoding="utf-8")
        self.sha256 = hashlib.sha256(self.source.encode()).hexdigest()
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        self._template = env.from_string(self.source)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text; raises ``jinja2.TemplateError`` on messages the template rejects."""
        return self._template.render(
            messages=messages, tools=tools or None, add_generation_prompt=add_generation_prompt, **template_kwargs
        )

    def render_sampled_turn(self, message: dict[str, Any]) -> str:
        """The exact text a model samples for ``message``: its rendering minus header and final newline.

        It ends with ``<|im_end|>``: a natural stop samples the end-of-turn token, and the newline
        after it belongs to the template glue of the next prompt.
        """
        rendered = self.render([{**message, "role": "assistant"}])
        if not rendered.startswith(ASSISTANT_HEADER) or not rendered.endswith(TURN_END + "\n"):
            raise ValueError("the template did not render an assistant turn as header + body + end")
        return rendered[len(ASSISTANT_HEADER) : -1]


@functools.lru_cache(maxsize=1)
def reference_template() -> ChatTemplate:
    """The process-wide compiled reference template."""
    return ChatTemplate()


def prepare_messages(
    messages: list[dict[str, Any]], tool_arguments: ToolArguments = "verbatim"
) -> list[dict[str, Any]]:
    """Messages as the template should see them (copies; the request is never mutated).

    Raises ``ValueError`` for arguments that are not JSON when ``tool_arguments`` is ``parsed``
    (vLLM answers those with a 400).
    """
    prepared: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict):
            raise ValueError("each message must be a JSON object")
        calls = message.get("tool_calls")
        if message.get("role") != "assistant" or calls is None:
            prepared.append(message)
            continue
        if not isinstance(calls, list):
            raise ValueError("assistant tool_calls must be a list")
        if not calls:
            prepared.append({k: v for k, v in message.items() if k != "tool_calls"})
            continue
        if tool_arguments == "verbatim":
            prepared.append(message)
            continue
        message = copy.deepcopy(message)
        for call in message["tool_calls"]:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                raise ValueError("each assistant tool call needs a 'function' object")
            arguments = function.get("arguments")
            if not arguments:
                function["arguments"] = {}
            elif isinstance(arguments, str):
                try:
                    function["arguments"] = json.loads(arguments)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"tool call arguments are not valid JSON: {exc}") from exc
        prepared.append(message)
    return prepared
