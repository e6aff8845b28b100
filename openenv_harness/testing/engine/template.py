"""Chat templates, rendered the way ``transformers.apply_chat_template`` renders them.

Why our own renderer: the recorder must never render, but the tests around it need an engine whose
prompt ids behave like a real model's. The engine serves either its own reference template
(``chat_template.jinja`` next to this module: ChatML-like and token-level prefix-preserving, so a
clean agent chain really is clean) or any Hugging Face template -- a model folder's, or one of the
templates TRL ships -- with the same Jinja settings transformers uses: a sandbox, ``trim_blocks``
and ``lstrip_blocks``, ``loopcontrols``, the ``{% generation %}`` tag (rendered as its body),
``tojson`` without HTML escaping, ``raise_exception`` and ``strftime_now``, and the tokenizer's
special tokens (``bos_token``, ``eos_token`` ...) as variables. A template's sha256 is the "served
template fingerprint" a recorder can report.

Two facts about a template decide how vLLM preprocesses messages for it (see ``messages``): its
*content format* (does it loop over message content parts, or read content as a string?) and
whether it knows the ``developer`` role. Both are read off the template's syntax tree here.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.meta import find_undeclared_variables
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from openenv_harness.testing.engine.messages import ContentFormat

TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")
ASSISTANT_HEADER = "<|im_start|>assistant\n"
TURN_END = "<|im_end|>"
#: The context a sampled assistant turn is rendered after: templates such as Qwen3.5's refuse a
#: conversation without a user query, and Qwen3's renders reasoning only after the last one.
_SAMPLING_CONTEXT: list[dict[str, Any]] = [{"role": "user", "content": "x"}]


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """``tojson`` as chat templates expect it: no HTML escaping, no key sorting, unicode kept."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}``: marks assistant output for loss masks; renders its body."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _refers_to(node: nodes.Node, name: str, key: str | None = None) -> bool:
    """``node`` is ``name`` (or ``name.key`` / ``name['key']``), possibly sliced, filtered or tested."""
    while True:
        if isinstance(node, (nodes.Filter, nodes.Test)) and node.node is not None:
            node = node.node
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
            node = node.node
        else:
            break
    if key is None:
        return isinstance(node, nodes.Name) and node.name == name
    if isinstance(node, nodes.Getattr):
        return isinstance(node.node, nodes.Name) and node.node.name == name and node.attr == key
    if isinstance(node, nodes.Getitem):
        return (isinstance(node.node, nodes.Name) and node.node.name == name
                and isinstance(node.arg, nodes.Const) and node.arg.value == key)
    return False


def _aliases(tree: nodes.Template, name: str) -> set[str]:
    """``name`` and every variable ``{% set %}`` from it (or from such a variable), transitively."""
    found, changed = {name}, True
    while changed:
        changed = False
        for assign in tree.find_all(nodes.Assign):
            if isinstance(assign.target, nodes.Name) and assign.target.name not in found and any(
                    _refers_to(assign.node, n) for n in found):
                found.add(assign.target.name)
                changed = True
    return found


def _loop_targets(tree: nodes.Template, sources: set[str]) -> Iterator[str]:
    for loop in tree.find_all(nodes.For):
        if isinstance(loop.target, nodes.Name) and any(_refers_to(loop.iter, s) for s in sources):
            yield loop.target.name


def detect_content_format(tree: nodes.Template) -> ContentFormat:
    """``openai`` when the template loops over a message's content parts, else ``string``.

    A loop counts when it iterates ``message.content`` (``message`` being a loop variable over
    ``messages``), a macro parameter some call binds to ``message.content``, or -- outside macros --
    a variable named ``content``.
    """
    messages = set(_loop_targets(tree, _aliases(tree, "messages")))
    if not messages:
        return "string"
    macro_loops: dict[int, set[str]] = {}
    for macro in tree.find_all(nodes.Macro):
        params = [arg.name for arg in macro.args]
        bound: set[str] = set()
        for call in tree.find_all(nodes.Call):
            if not (isinstance(call.node, nodes.Name) and call.node.name == macro.name):
                continue
            for position, arg in enumerate(call.args):
                if position < len(params) and any(_refers_to(arg, m, "content") for m in messages):
                    bound.add(params[position])
            for keyword in call.kwargs:
                if keyword.key in params and any(_refers_to(keyword.value, m, "content") for m in messages):
                    bound.add(keyword.key)
        for loop in macro.find_all(nodes.For):
            macro_loops[id(loop)] = bound
    for loop in tree.find_all(nodes.For):
        if any(_refers_to(loop.iter, m, "content") for m in messages):
            return "openai"
        in_macro = macro_loops.get(id(loop))
        if isinstance(loop.iter, nodes.Name):
            if in_macro is not None and loop.iter.name in in_macro:
                return "openai"
            if in_macro is None and loop.iter.name == "content":
                return "openai"
    return "string"


class ChatTemplate:
    """A compiled chat template, its fingerprint, and what vLLM's preprocessing reads off it."""

    def __init__(self, source: str | None = None, special_tokens: dict[str, str] | None = None,
                 name: str | None = None) -> None:
        self.source = source if source is not None else TEMPLATE_PATH.read_text(encoding="utf-8")
        self.name = name or ("reference" if source is None else "custom")
        self.sha256 = hashlib.sha256(self.source.encode()).hexdigest()
        #: ``bos_token``, ``eos_token`` ...: variables transformers passes to every template
        self.special_tokens = dict(special_tokens or {})
        self.eos_text = self.special_tokens.get("eos_token") or TURN_END
        env = _environment()
        tree = env.parse(self.source)
        self.variables = frozenset(find_undeclared_variables(tree))
        self.content_format: ContentFormat = detect_content_format(tree)
        self.knows_developer = '"developer"' in self.source or "'developer'" in self.source
        self._template = env.from_string(self.source)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text; raises ``jinja2.TemplateError`` on messages the template rejects."""
        context = {**self.special_tokens, **template_kwargs}
        return self._template.render(messages=messages, tools=tools or None,
                                     add_generation_prompt=add_generation_prompt, **context)

    def accepted_kwargs(self, kwargs: dict[str, Any] | None) -> dict[str, Any]:
        """``chat_template_kwargs`` the template reads (vLLM passes only those on)."""
        reserved = {"messages", "tools", "add_generation_prompt"}
        return {k: v for k, v in (kwargs or {}).items() if k in self.variables and k not in reserved}

    def render_sampled_turn(self, message: dict[str, Any]) -> str:
        """The exact text a model samples for ``message``: what the template adds after a generation
        prompt, up to and including the end-of-turn token.

        It ends with the end-of-turn text (``<|im_end|>``): a natural stop samples that token, and
        what follows it belongs to the template glue of the next prompt.
        """
        prompt = self.render(_SAMPLING_CONTEXT, add_generation_prompt=True)
        full = self.render([*_SAMPLING_CONTEXT, {**message, "role": "assistant"}])
        end = full.rfind(self.eos_text)
        if not full.startswith(prompt) or end < len(prompt):
            raise ValueError(f"the {self.name} template does not render an assistant turn as generation prompt "
                             f"+ body + {self.eos_text}; it cannot be sampled from")
        return full[len(prompt) : end + len(self.eos_text)]


@functools.lru_cache(maxsize=1)
def reference_template() -> ChatTemplate:
    """The process-wide compiled reference template."""
    return ChatTemplate()


def _special_tokens(folder: Path) -> dict[str, str]:
    """The special-token variables transformers passes to templates, from ``tokenizer_config.json``."""
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    tokens: dict[str, str] = {}
    for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        value = config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[key] = value
    return tokens


def model_template_source(folder: Path) -> str | None:
    """A model folder's own template: ``chat_template.jinja``, else ``tokenizer_config.json``'s."""
    file = folder / "chat_template.jinja"
    if file.is_file():
        return file.read_text(encoding="utf-8")
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    template = config.get("chat_template")
    return template if isinstance(template, str) else None


def load_chat_template(template: Path | None = None, model_folder: Path | None = None) -> ChatTemplate:
    """What vLLM serves: ``--chat-template`` when given, else the model folder's own, else ours.

    The model folder (when given) also supplies the special-token variables.
    """
    special = _special_tokens(model_folder) if model_folder is not None else {}
    if template is not None:
        return ChatTemplate(Path(template).read_text(encoding="utf-8"), special, name=Path(template).name)
    if model_folder is not None:
        source = model_template_source(model_folder)
        if source is not None:
            return ChatTemplate(source, special, name=f"{model_folder.name} model")
    return ChatTemplate(special_tokens=special) if special else reference_template()
