"""The authenticate step alone: the bearer key is the session's secret, on its path or on a bare route."""

from __future__ import annotations

import asyncio

import pytest

from openenv_harness.recorder.call.admit import authenticate
from openenv_harness.recorder.context import RecorderContext
from openenv_harness.recorder.errors import AgentError
from openenv_harness.recorder.session.live import LiveSession
from openenv_harness.recorder.session.spec import SessionSpec


async def _session_with_secret(ctx: RecorderContext) -> tuple[LiveSession, str]:
    """A session in the registry and its store, and the secret ``new`` returned (only once)."""
    session, secret = ctx.sessions.new(SessionSpec())
    await ctx.sessions.add(session)
    return session, secret


def _refused(ctx: RecorderContext, path_session: str | None, headers: dict[str, str]) -> AgentError:
    with pytest.raises(AgentError) as refused:
        authenticate(ctx.sessions, path_session, headers)
    return refused.value


class _Call:
    """A call in flight as a close sees it (``CallInFlight``)."""

    def cancel_for_close(self) -> None:
        raise AssertionError("a call that ends within the grace is not cancelled")


@pytest.mark.parametrize("headers", [
    {},
    {"authorization": "Bearer "},  # a bearer scheme with no key
    {"authorization": "Basic dXNlcjpwYXNz"},  # another scheme carries no key
    {"x-api-key": ""},
])
async def test_a_call_without_a_key_is_refused_before_any_session_is_looked_up(
        ctx: RecorderContext, headers: dict[str, str]) -> None:
    session, _ = await _session_with_secret(ctx)
    for path_session in (session.id, None):
        error = _refused(ctx, path_session, headers)
        assert (error.status, error.type) == (401, "authentication_error")
        assert error.message.startswith("missing API key")


@pytest.mark.parametrize("header", ["authorization", "x-api-key", "x-goog-api-key"])
async def test_the_sessions_secret_opens_its_path_and_the_bare_route_in_each_sdks_header(
        ctx: RecorderContext, header: str) -> None:
    session, secret = await _session_with_secret(ctx)
    await _session_with_secret(ctx)  # another session in the registry: not the one found
    headers = {header: f"Bearer {secret}" if header == "authorization" else secret}
    assert authenticate(ctx.sessions, session.id, headers) is session
    assert authenticate(ctx.sessions, None, headers) is session  # found by its key's digest


async def test_a_wrong_key_or_an_unknown_path_session_is_an_invalid_key_for_this_session(
        ctx: RecorderContext) -> None:
    session, secret = await _session_with_secret(ctx)
    other, other_secret = await _session_with_secret(ctx)
    cases = [
        (session.id, "oeh-not-a-secret"),
        (session.id, other_secret),  # a valid key, but another session's: it opens only its own path
        (other.id, secret),
        ("s-unknown", secret),  # a real key on a path naming no session
    ]
    for path_session, key in cases:
        error = _refused(ctx, path_session, {"authorization": f"Bearer {key}"})
        assert (error.status, error.type, error.message) == (
            401, "authentication_error", "invalid API key for this session"), (path_session, key)
    assert authenticate(ctx.sessions, other.id, {"authorization": f"Bearer {other_secret}"}) is other


async def test_an_unknown_key_on_the_bare_route_is_an_invalid_key(ctx: RecorderContext) -> None:
    await _session_with_secret(ctx)
    error = _refused(ctx, None, {"x-api-key": "oeh-not-a-secret"})
    assert (error.status, error.type, error.message) == (401, "authentication_error", "invalid API key")


async def test_a_stopped_session_still_authenticates_its_budget_step_refuses_it(ctx: RecorderContext) -> None:
    session, secret = await _session_with_secret(ctx)
    await ctx.sessions.stop(session, "max_calls")
    assert authenticate(ctx.sessions, session.id, {"authorization": f"Bearer {secret}"}) is session


async def test_a_closing_and_then_closed_session_is_refused_with_session_closed(ctx: RecorderContext) -> None:
    session, secret = await _session_with_secret(ctx)
    headers = {"authorization": f"Bearer {secret}"}
    call = _Call()
    session.call_started(call)  # a call in flight keeps the close waiting: the session is closing
    closing = asyncio.create_task(ctx.sessions.close(session, grace_s=5.0))
    for _ in range(100):
        if session.closing:
            break
        await asyncio.sleep(0)
    assert session.closing and session.status == "open"
    for path_session in (session.id, None):
        error = _refused(ctx, path_session, headers)
        assert (error.status, error.code, error.type) == (409, "session_closed", "invalid_request_error")
        assert error.message == f"session {session.id} is closed"
    session.call_ended(call)
    await asyncio.wait_for(closing, 5.0)
    assert session.status == "closed"
    for path_session in (session.id, None):
        error = _refused(ctx, path_session, headers)
        assert (error.status, error.code) == (409, "session_closed")
    # the key is checked first: a closed session's path with a wrong key is still a 401
    assert _refused(ctx, session.id, {"x-api-key": "oeh-wrong"}).status == 401
