"""The environment server: OpenEnv's app around ``HarnessRolloutEnvironment``, plus the recorder.

``app`` is what ``openenv.yaml`` names (``server.app:app``) and what the Docker image serves via
``main()``. It is built from ``OEH_*`` environment variables (see ``config.py``); the backend --
recorder and, without ``OEH_ENGINE_URL``, the reference engine -- starts with the app and stops
with it. ``build_app(config)`` builds another one (tests, embedding).

Episodes need a session: connect with ``HarnessEnv`` (OpenEnv's WebSocket client). OpenEnv's
HTTP ``/reset`` and ``/step`` make a fresh environment per request and close it afterwards, so an
agent started by HTTP ``/reset`` is killed when that request ends, and HTTP ``/step`` answers 409
saying so. Every error gets its status and reason, on HTTP as on the WebSocket (``errors.py``).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os

import uvicorn
from fastapi import FastAPI
from openenv.core.env_server.http_server import create_app

from .backend import HarnessBackend
from .config import EnvServerConfig
from .errors import install_error_handlers
from .harness_environment import ENV_NAME, HarnessRolloutEnvironment
from .records_proxy import recorder_proxy_router
from .tasks import server_tasks

try:
    from ..models import HarnessObservation, HarnessState, RunAgent
except ImportError:  # served as the top-level ``server`` package (uvicorn server.app:app)
    from models import HarnessObservation, HarnessState, RunAgent  # type: ignore[no-redef]


def build_app(config: EnvServerConfig | None = None) -> FastAPI:
    """An environment server app; its backend is ``app.state.harness_backend``."""
    config = config or EnvServerConfig.from_environ()
    backend = HarnessBackend(config, server_tasks(config.tasks_file))
    app = create_app(
        functools.partial(HarnessRolloutEnvironment, backend=backend),
        RunAgent,
        HarnessObservation,
        env_name=ENV_NAME,
        max_concurrent_envs=config.max_concurrent_envs,
        state_cls=HarnessState,
    )
    app.state.harness_backend = backend
    install_error_handlers(app)
    app.include_router(recorder_proxy_router(backend))
    app.router.on_startup.append(backend.start)
    app.router.on_shutdown.append(backend.stop)
    return app


app = build_app()


def main() -> None:
    """Serve ``app`` on ``--host``/``--port`` (default ``$HOST`` or 0.0.0.0, ``$PORT`` or 8000)."""
    parser = argparse.ArgumentParser(description="The harness_env OpenEnv environment server")
    parser.add_argument("--host", default=os.environ.get("HOST", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    args = parser.parse_args()
    level = os.environ.get("LOG_LEVEL", "info")
    _log_to_stderr(level)
    uvicorn.run(app, host=args.host, port=args.port, log_level=level)


def _log_to_stderr(level: str) -> None:
    """Our own log lines (deployment mode, recorder URL, shutdown) go to the container log."""
    logger = logging.getLogger("harness_env")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper())


if __name__ == "__main__":
    main()
