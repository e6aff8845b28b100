"""Tag each call ``agent`` or ``aux`` from what the boundary can see (D17).

Aux calls -- title generators, context summarizers, compaction -- are recorded like any other but
are excluded from training traces (a masked aux call in the middle of a chain still splits TRL's
reconciler). The tag is a hint from the request's shape: tools present, the first system prompt's
opening words, the model name. Rules come from the harness preset; a session can override them.
"""

from __future__ import annotations

from typing import Any

from openenv_harness.recorder.session.spec import AuxRule

#: Markers of the aux calls the supported CLIs make (captured from the real CLIs).
DEFAULT_AUX_RULES: tuple[AuxRule, ...] = (
    AuxRule(name="opencode-title", system_prompt_startswith="You are a title generator"),
    AuxRule(name="opencode-compaction", system_prompt_startswith="You are a context summarization agent"),
    AuxRule(name="pi-compaction", system_prompt_startswith="You are a context summarization assistant"),
    AuxRule(name="codex-compaction", no_tools=True,
            last_user_message_startswith="You are performing a CONTEXT CHECKPOINT COMPACTION"),
    AuxRule(name="claude-code-title", no_tools=True, system_prompt_contains="You are naming a coding session"),
    # Coding agents always offer their tools on policy calls; a call without tools is bookkeeping.
    AuxRule(name="no-tools", no_tools=True),
)


def system_prompt(body: dict[str, Any]) -> str:
    """The text of the first system/developer message ('' when there is none)."""
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        if message.get("role") in ("system", "developer"):
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "".join(
                    part.get("text", "") for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
                )
            return ""
        return ""
    return ""


def last_user_message(body: dict[str, Any]) -> str:
    """The text of the last user message ('' when there is none): Codex puts its compaction
    instruction there, under its usual system prompt."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "".join(
                    part.get("text", "") for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
                )
            return ""
    return ""


def _matches(rule: AuxRule, body: dict[str, Any], has_tools: bool, prompt: str) -> bool:
    if rule.no_tools is not None and rule.no_tools == has_tools:
        return False
    if rule.system_prompt_startswith is not None and not prompt.startswith(rule.system_prompt_startswith):
        return False
    if rule.system_prompt_contains is not None and rule.system_prompt_contains not in prompt:
        return False
    if rule.last_user_message_startswith is not None and not last_user_message(body).startswith(
        rule.last_user_message_startswith
    ):
        return False
    return not (rule.model is not None and body.get("model") != rule.model)


def classify_call(body: dict[str, Any], rules: tuple[AuxRule, ...] | list[AuxRule] | None = None) -> tuple[str, str | None]:
    """``("aux", rule_name)`` when a rule matches, else ``("agent", None)``."""
    active = DEFAULT_AUX_RULES if rules is None else rules
    tools = body.get("tools")
    has_tools = isinstance(tools, list) and len(tools) > 0
    prompt = system_prompt(body)
    for rule in active:
        if _matches(rule, body, has_tools, prompt):
            return "aux", rule.name
    return "agent", None
