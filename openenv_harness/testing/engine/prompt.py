"""A request's prompt: vLLM's preprocessing, then the served template, then the tokenizer.

Why one function for both routes: ``/v1/chat/completions`` and ``/tokenize`` must agree on every
step they share, and differ exactly where vLLM 0.32 makes them differ (only the chat route renames
a replayed ``reasoning_content``); see ``messages`` for the rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jinja2 import TemplateError

from openenv_harness.testing.engine.config import EngineConfig
from openenv_harness.testing.engine.messages import MessageError, Route, prepare_messages, prepare_tools
from openenv_harness.testing.engine.template import ChatTemplate
from openenv_harness.testing.engine.tokenizer import THINK_CLOSE, THINK_OPEN, ReferenceTokenizer

_UNEXPECTED_KWARGS = {"chat_template", "tokenize"}


@dataclass(frozen=True)
class Prompt:
    text: str
    ids: list[int]
    #: the prompt ends inside an open ``<think>`` block (the model's output starts as reasoning)
    open_think: bool


def render_prompt(config: EngineConfig, template: ChatTemplate, tokenizer: ReferenceTokenizer, *,
                  messages: list[Any], tools: list[Any] | None, add_generation_prompt: bool,
                  chat_template_kwargs: dict[str, Any] | None, route: Route) -> Prompt:
    """Raises ``MessageError`` (vLLM's 400) for messages, tools or kwargs it rejects."""
    unexpected = _UNEXPECTED_KWARGS & set(chat_template_kwargs or {})
    if unexpected:
        raise MessageError(f"Found unexpected chat template kwargs from request: {sorted(unexpected)}",
                           "chat_template_kwargs")
    prepared = prepare_messages(messages, route=route, content_format=template.content_format,
                                tool_arguments=config.tool_arguments, reasoning_content=config.reasoning_content,
                                developer_role=template.knows_developer)
    try:
        text = template.render(prepared, prepare_tools(tools), add_generation_prompt,
                               **template.accepted_kwargs(chat_template_kwargs))
    except (TemplateError, TypeError, ValueError) as exc:
        raise MessageError(str(exc)) from exc
    tail = text[text.rfind(THINK_OPEN):] if THINK_OPEN in text else ""
    return Prompt(text, tokenizer.encode(text), open_think=bool(tail) and THINK_CLOSE not in tail)
