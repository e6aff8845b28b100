"""The ``openenv-harness`` command: serve, run, trace, doctor."""

from openenv_harness.cli.app import app, main

__all__ = ["app", "main"]
