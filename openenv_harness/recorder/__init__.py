"""The interception server: forwards agent calls to the engine and records one TraceEntry each.

No tokenizer, no chat template, no token buffer: the recorder records what the engine reports.

Names are imported on first use (PEP 562): the store's index process imports
``openenv_harness.recorder.store`` without paying for the web server it never runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "create_recorder_app": "openenv_harness.recorder.app",
    "RecorderAPIError": "openenv_harness.recorder.client",
    "RecorderClient": "openenv_harness.recorder.client",
    "RecorderConfig": "openenv_harness.recorder.config",
    "RecorderContext": "openenv_harness.recorder.context",
    "RecorderServer": "openenv_harness.recorder.server",
    "ThreadedServer": "openenv_harness.recorder.serving",
    "free_port": "openenv_harness.recorder.serving",
    "serve": "openenv_harness.recorder.server",
    "AuxRule": "openenv_harness.recorder.session.spec",
    "Budgets": "openenv_harness.recorder.session.spec",
    "SessionSpec": "openenv_harness.recorder.session.spec",
}

__all__ = sorted(_WHERE)

if TYPE_CHECKING:
    from openenv_harness.recorder.app import create_recorder_app
    from openenv_harness.recorder.client import RecorderAPIError, RecorderClient
    from openenv_harness.recorder.context import RecorderConfig, RecorderContext
    from openenv_harness.recorder.server import RecorderServer, serve
    from openenv_harness.recorder.serving import ThreadedServer, free_port
    from openenv_harness.recorder.session.spec import AuxRule, Budgets, SessionSpec


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
