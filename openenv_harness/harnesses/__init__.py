"""Harness presets: how to configure, launch and read each supported agent CLI.

A preset is declarative (``HarnessPreset``); ``get_preset("pi")``, ``"opencode"``, ``"codex"`` and
``"claude-code"`` return them, ``ensure_installed`` puts the pinned CLIs in the project's node prefix, and ``doctor`` says
whether each one is installed and runs.
"""

from openenv_harness.harnesses.base import (
    API_KEY_ENV,
    AuxCondition,
    AuxRule,
    HarnessOptions,
    HarnessPreset,
    HarnessResult,
    HarnessSetup,
    LaunchSpec,
)
from openenv_harness.harnesses.registry import UnknownHarnessError, get_preset, list_presets, preset_names

__all__ = [
    "API_KEY_ENV",
    "AuxCondition",
    "AuxRule",
    "HarnessOptions",
    "HarnessPreset",
    "HarnessResult",
    "HarnessSetup",
    "LaunchSpec",
    "UnknownHarnessError",
    "get_preset",
    "list_presets",
    "preset_names",
]
