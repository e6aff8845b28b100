"""Tasks: what an agent is asked to do, the files it starts from, and how its work is scored.

The reward comes from the environment, never from the agent (D7): a task's verifier runs inside
the sandbox after the agent has finished (for example the task's own tests). ``None`` means the
verifier could not run -- an unscored rollout, which a trainer leaves out of the group baseline,
never a 0.0.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from openenv_harness.sandbox.base import Sandbox, SandboxError


@dataclass
class VerifyOutcome:
    reward: float | None
    exit_code: int | None = None
    detail: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)


class Task(BaseModel):
    """One task. ``verify_command`` runs in the sandbox's working directory; exit 0 scores 1.0."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    instruction: str = Field(min_length=1)
    files: dict[str, str] = Field(default_factory=dict, description="Relative path → content, placed before the run")
    verify_command: str | None = Field(None, description="Shell command; exit 0 → reward 1.0, else 0.0")
    verify_timeout_s: float = Field(120.0, gt=0)
    metadata: dict[str, Any] = Field(default_factory=dict)
    #: A scripted solution for the embedded reference engine (demo and tests); real engines ignore it.
    reference_script: list[dict[str, Any]] | None = None

    def place(self, sandbox: Sandbox) -> None:
        for path, content in self.files.items():
            sandbox.write_file(path, content)

    def verify(self, sandbox: Sandbox) -> VerifyOutcome:
        if self.verify_command is None:
            return VerifyOutcome(reward=None, detail="task has no verifier")
        try:
            result = sandbox.run(self.verify_command, cwd=sandbox.workdir, timeout_s=self.verify_timeout_s)
        except SandboxError as exc:
            return VerifyOutcome(reward=None, detail=f"verifier could not run: {exc}")
        if result.timed_out:
            return VerifyOutcome(reward=None, exit_code=result.exit_code, detail="verifier timed out")
        tail = (result.stdout + result.stderr)[-2000:]
        return VerifyOutcome(
            reward=1.0 if result.exit_code == 0 else 0.0,
            exit_code=result.exit_code,
            detail=tail,
            metrics={"verify_s": round(result.duration_s, 3)},
        )


def task_from(value: Any, tasks: dict[str, Task] | None = None) -> Task:
    """Accept what trainers pass as a task: a ``Task``, a task id, a dict, a prompt, or messages."""
    if isinstance(value, Task):
        return value
    if isinstance(value, dict):
        if "instruction" in value:
            return Task.model_validate(value)
        if "prompt" in value:
            return task_from(value["prompt"], tasks)
        if "task_id" in value and tasks and value["task_id"] in tasks:
            return tasks[value["task_id"]]
        raise ValueError(f"cannot read a task from keys {sorted(value)}")
    if isinstance(value, list):  # chat messages: the last user message is the instruction
        for message in reversed(value):
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, list):
                    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
                return task_from(str(content), tasks)
        raise ValueError("messages contain no user message")
    if isinstance(value, str):
        if tasks and value in tasks:
            return tasks[value]
        digest = hashlib.sha256(value.encode()).hexdigest()[:12]
        return Task(id=f"prompt-{digest}", instruction=value)
    raise TypeError(f"unsupported task type {type(value).__name__}")
