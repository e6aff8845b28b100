"""Step: the bearer key is the session secret (D5). Unknown, missing or another session's key → 401."""

from __future__ import annotations

from collections.abc import Mapping

from openenv_harness.recorder.auth import bearer_token, digests_match, secret_digest
from openenv_harness.recorder.errors import AgentError, session_closed
from openenv_harness.recorder.session.live import LiveSession
from openenv_harness.recorder.session.registry import SessionRegistry


def authenticate(sessions: SessionRegistry, path_session: str | None, headers: Mapping[str, str]) -> LiveSession:
    """The session a call's key opens: the path's session when it names one, else the key's own."""
    key = bearer_token(headers)
    if not key:
        raise AgentError(401, "missing API key: send the session secret as a Bearer token", type="authentication_error")
    if path_session is not None:
        session = sessions.get(path_session)
        if session is None or not digests_match(session.secret_digest, key):
            raise AgentError(401, "invalid API key for this session", type="authentication_error")
    else:
        session = sessions.by_digest(secret_digest(key))
        if session is None:
            raise AgentError(401, "invalid API key", type="authentication_error")
    if session.status == "closed" or session.closing:
        raise session_closed(session)
    return session
