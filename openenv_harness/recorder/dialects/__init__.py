"""The agent APIs the recorder speaks besides Chat Completions, and which path speaks which.

``chat`` is the flow's own shape (no adapter); ``responses`` (Codex) and ``anthropic`` (Claude
Code) are adapters at the two ends of the same flow (``base.Dialect``).
"""

from __future__ import annotations

from openenv_harness.recorder.dialects.anthropic import ANTHROPIC, AnthropicDialect
from openenv_harness.recorder.dialects.base import Dialect, DialectCall
from openenv_harness.recorder.dialects.memory import ReplayMemory
from openenv_harness.recorder.dialects.responses import RESPONSES, ResponsesDialect

CHAT_SUFFIX = "/v1/chat/completions"

#: Route suffix -> its dialect (None: plain chat). Each is served at ``/rollout/<session><suffix>``
#: (session in the path) and bare at ``<suffix>`` (session found from the key).
AGENT_ROUTES: dict[str, Dialect | None] = {CHAT_SUFFIX: None, RESPONSES.path_suffix: RESPONSES,
                                           ANTHROPIC.path_suffix: ANTHROPIC}


def agent_target(path: str) -> tuple[bool, str | None, Dialect | None]:
    """``(matched, session id or None, dialect or None)`` for a POST path."""
    for suffix, dialect in AGENT_ROUTES.items():
        if path == suffix:
            return True, None, dialect
        if path.startswith("/rollout/") and path.endswith(suffix):
            session_id = path[len("/rollout/") : -len(suffix)]
            if session_id and "/" not in session_id:
                return True, session_id, dialect
    return False, None, None


__all__ = ["AGENT_ROUTES", "ANTHROPIC", "CHAT_SUFFIX", "RESPONSES", "AnthropicDialect", "Dialect", "DialectCall",
           "ReplayMemory", "ResponsesDialect", "agent_target"]
