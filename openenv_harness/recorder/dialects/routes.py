"""Which agent API each route speaks: every agent call enters and leaves through its dialect."""

from __future__ import annotations

from openenv_harness.recorder.dialects.anthropic import ANTHROPIC
from openenv_harness.recorder.dialects.base import Dialect
from openenv_harness.recorder.dialects.chat import CHAT
from openenv_harness.recorder.dialects.gemini import GEMINI, GENERATE, STREAM, parse_target
from openenv_harness.recorder.dialects.responses import RESPONSES

CHAT_SUFFIX = CHAT.path_suffix
DIALECTS: tuple[Dialect, ...] = (CHAT, RESPONSES, ANTHROPIC, GEMINI)
#: Route suffix -> its dialect, for the dialects with one fixed path. Each is served at
#: ``/rollout/<session><suffix>`` (session in the path) and bare at ``<suffix>`` (session found from
#: the key). Google's model-method paths are matched by ``gemini.parse_target``.
AGENT_ROUTES: dict[str, Dialect] = {d.path_suffix: d for d in (CHAT, RESPONSES, ANTHROPIC)}
#: A record's ``metadata.dialect`` -> the dialect that handed its reply out (``session/restore.py``).
BY_NAME: dict[str, Dialect] = {d.name: d for d in DIALECTS}

__all__ = ["AGENT_ROUTES", "ANTHROPIC", "BY_NAME", "CHAT", "CHAT_SUFFIX", "DIALECTS", "GEMINI", "RESPONSES",
           "agent_target"]


def agent_target(path: str) -> tuple[str | None, Dialect] | None:
    """``(session id or None, dialect)`` for an agent call's POST path; None for any other path."""
    for suffix, dialect in AGENT_ROUTES.items():
        if path == suffix:
            return None, dialect
        if path.startswith("/rollout/") and path.endswith(suffix):
            session_id = path[len("/rollout/") : -len(suffix)]
            if session_id and "/" not in session_id:
                return session_id, dialect
    gemini = parse_target(path)
    if gemini is not None and gemini.method in (GENERATE, STREAM):
        return gemini.session_id, GEMINI.bound(gemini)
    return None
