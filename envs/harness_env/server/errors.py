"""The environment's errors, and the HTTP answer each one gets.

Why its own module: OpenEnv's WebSocket session turns any exception into an error frame with its
message, but its stateless HTTP routes (``POST /reset``, ``POST /step``) let them through, so the
client saw a bare ``500 Internal Server Error``. Each error the environment raises says what went
wrong and carries its status; ``install_error_handlers`` answers it as ``{"detail": message,
"error": code}`` with that status, on every route:

- 400 ``bad_request``: a reset option is unknown, of the wrong type or inconsistent.
- 404 ``unknown_task``: no task (or split) by that name.
- 409 ``no_episode``: a step with no running episode -- over HTTP always, since each request gets a
  fresh environment (the answer says so and names the WebSocket session to use instead).
- 422: a malformed action, answered by OpenEnv itself with pydantic's errors (``loc`` names the field).
- 503 ``backend_unavailable``: this server cannot run episodes (backend not started, CLI missing).
- 502 ``recorder_error``: the recorder refused the episode's session.
- 500 ``internal_error``: anything else, named by its type (the traceback goes to the server log).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from openenv_harness.recorder.client import RecorderAPIError

#: Added to a ``no_episode`` answer on the stateless HTTP routes.
HTTP_IS_STATELESS = (
    "OpenEnv's HTTP /reset and /step are stateless: each request gets a fresh environment, closed when "
    "the request ends, so no episode started by an earlier /reset is running. Run episodes over the "
    "WebSocket session (/ws): HarnessEnv, or OpenEnv's GenericEnvClient."
)


class EnvRequestError(Exception):
    """An error the client can act on; ``status_code`` and ``code`` are its HTTP answer."""

    status_code = 400
    code = "bad_request"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequestError(EnvRequestError, ValueError):
    """A reset option is unknown, of the wrong type or inconsistent with another."""


class UnknownTaskError(EnvRequestError, ValueError):
    """No task has the requested id (or index), or no split that name."""

    status_code = 404
    code = "unknown_task"


class EpisodeError(EnvRequestError, RuntimeError):
    """A step that the episode's phase does not allow (no episode yet, or already done)."""

    status_code = 409
    code = "no_episode"


class BackendError(EnvRequestError, RuntimeError):
    """This server cannot serve episodes (not started, or a CLI is missing)."""

    status_code = 503
    code = "backend_unavailable"


def _answer(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"detail": message, "error": code}, status_code=status)


async def _env_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EnvRequestError)
    message = exc.message
    if isinstance(exc, EpisodeError) and request.url.path.rstrip("/") == "/step":
        message = f"{message}. {HTTP_IS_STATELESS}"
    return _answer(exc.status_code, exc.code, message)


async def _recorder_error(request: Request, exc: Exception) -> JSONResponse:
    return _answer(502, "recorder_error", f"the recorder refused the episode: {exc}")


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette still re-raises it after this answer, so the traceback reaches the server log
    return _answer(500, "internal_error", f"internal error in the environment server ({type(exc).__name__}); "
                                          "see the server log")


def install_error_handlers(app: FastAPI) -> None:
    """Answer the environment's errors with their status and reason (see the module docstring)."""
    app.add_exception_handler(EnvRequestError, _env_error)
    app.add_exception_handler(RecorderAPIError, _recorder_error)
    app.add_exception_handler(Exception, _internal_error)
