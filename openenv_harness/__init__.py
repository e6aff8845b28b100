"""openenv-harness: token-faithful interception of unmodified coding agents for RL trainers.

An OpenEnv extension. The recorder (``openenv_harness.recorder``) sits between an agent and a
trainer-controlled engine and durably records one OpenEnv ``TraceEntry`` per model call; trainers
assemble samples from those records (``openenv_harness.assembly``).
"""

from openenv_harness.version import __version__

__all__ = ["__version__"]
