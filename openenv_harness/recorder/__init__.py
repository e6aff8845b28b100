"""The interception server: forwards agent calls to the engine and records one TraceEntry each.

No tokenizer, no chat template, no token buffer: the recorder records what the engine reports.
"""

from openenv_harness.recorder.app import create_recorder_app
from openenv_harness.recorder.client import RecorderAPIError, RecorderClient
from openenv_harness.recorder.context import RecorderConfig, RecorderContext
from openenv_harness.recorder.server import RecorderServer, ThreadedServer, free_port, serve
from openenv_harness.recorder.sessions import AuxRule, Budgets, SessionSpec

__all__ = [
    "AuxRule", "Budgets", "RecorderAPIError", "RecorderClient", "RecorderConfig", "RecorderContext",
    "RecorderServer", "SessionSpec", "ThreadedServer", "create_recorder_app", "free_port", "serve",
]
