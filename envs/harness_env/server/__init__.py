"""The harness_env server: the environment, its backend (recorder and engine) and the app."""

from .harness_environment import HarnessRolloutEnvironment

__all__ = ["HarnessRolloutEnvironment"]
