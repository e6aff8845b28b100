"""The pieces a local run needs: an engine (the embedded reference engine unless a URL is given)
and a recorder in front of it, both on loopback.

The embedded engine is the project's CPU test double of vLLM (``openenv_harness.testing.engine``):
it serves each built-in task's scripted solution, so the demo drives the real agents through real
multi-turn tool use with no GPU and no network. With ``--engine-url`` the same run goes to a real
vLLM instead.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from openenv_harness.recorder.auth import new_admin_token
from openenv_harness.recorder.context import RecorderConfig
from openenv_harness.recorder.server import RecorderServer
from openenv_harness.rollout.tasks import Task


class LocalStack:
    def __init__(self, *, engine_url: str | None, store_path: str, model: str | None,
                 tasks: list[Task], segmentation: str = "canonical", admin_token: str | None = None) -> None:
        self.engine_url = engine_url
        self.store_path = store_path
        self.model = model
        self.tasks = tasks
        self.segmentation = segmentation
        self.admin_token = admin_token or new_admin_token()
        self.engine: Any = None
        self.recorder: RecorderServer | None = None

    @property
    def embedded(self) -> bool:
        return self.engine_url is None

    def model_for(self, task: Task, harness: str | None = None) -> str:
        """The model name a rollout of ``task`` by ``harness`` asks for (the embedded engine's script key:
        one per shell-tool spelling, ``rollout.taskset.script_for``)."""
        if self.embedded:
            if harness is None:
                return f"reference/{task.id}"
            from openenv_harness.harnesses.registry import get_preset

            name, _ = get_preset(harness).shell_tool
            return f"reference/{task.id}" if name == "bash" else f"reference/{task.id}/{name}"
        assert self.model is not None
        return self.model

    def __enter__(self) -> "LocalStack":
        url = self.engine_url
        if url is None:
            from openenv_harness.harnesses.registry import list_presets
            from openenv_harness.rollout.taskset import script_for
            from openenv_harness.testing.engine import EngineServer, Script

            self.engine = EngineServer().start()
            for task in self.tasks:
                turns = task.reference_script or [{"content": "I cannot solve this task."}]
                for preset in list_presets():
                    self.engine.set_script(self.model_for(task, preset.name),
                                           Script(turns=script_for(turns, preset.name), segmentation=self.segmentation))
            url = self.engine.url
        Path(self.store_path).parent.mkdir(parents=True, exist_ok=True)
        config = RecorderConfig(store_path=self.store_path, engine_url=url, admin_token=self.admin_token)
        self.recorder = RecorderServer(config).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.recorder is not None:
            self.recorder.stop()
        if self.engine is not None:
            self.engine.stop()


def default_run_dir() -> str:
    return os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
