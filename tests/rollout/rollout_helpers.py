"""Helpers for rollout tests: factories whose model name selects a reference-engine script."""

from __future__ import annotations

from openenv_harness.recorder import RecorderServer
from openenv_harness.rollout import BUILTIN_TASKS, HarnessSessionFactory
from openenv_harness.testing.engine import EngineServer, Script

ADMIN = "rollout-admin-token-0123456789abcdef"


def scripted_factory(engine: EngineServer, recorder: RecorderServer, harness: str, task_id: str, *,
                     segmentation: str = "canonical", script: Script | None = None, **kw) -> HarnessSessionFactory:
    """A factory whose model name selects the engine script solving ``task_id``."""
    model = f"ref-{harness}-{task_id}-{segmentation}"
    engine.set_script(model, script or Script(turns=BUILTIN_TASKS[task_id].reference_script, segmentation=segmentation))
    return HarnessSessionFactory(harness=harness, recorder_url=recorder.url, admin_token=ADMIN, model=model, **kw)
