"""Rollouts for trainers: tasks, session factories (TRL loop-owning mode) and the RFC 005 adapter.

Importing this package imports OpenEnv (its session classes are what we subclass and return).
"""

from openenv_harness.rollout.factory import HarnessSessionFactory, TRLSessionFactory
from openenv_harness.rollout.launch import LaunchedAgent, launch_agent
from openenv_harness.rollout.session import HarnessSession, RolloutCaptureError
from openenv_harness.rollout.tasks import Task, VerifyOutcome, task_from
from openenv_harness.rollout.taskset import BUILTIN_TASKS
from openenv_harness.rollout.white_box import AgentCLIAdapter, TaskSession

__all__ = [
    "AgentCLIAdapter", "BUILTIN_TASKS", "HarnessSession", "HarnessSessionFactory", "LaunchedAgent",
    "RolloutCaptureError", "TRLSessionFactory", "Task", "TaskSession", "VerifyOutcome", "launch_agent", "task_from",
]
