"""The known harness presets, by name.

Adding an agent CLI is one preset module plus one entry here; everything else (installer, doctor,
rollout, the recorder's aux rules) reads presets through this registry.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from openenv_harness.harnesses.base import HarnessPreset
from openenv_harness.harnesses.claude_code import CLAUDE_CODE
from openenv_harness.harnesses.cline import CLINE
from openenv_harness.harnesses.codex import CODEX
from openenv_harness.harnesses.continue_cli import CONTINUE
from openenv_harness.harnesses.gemini_cli import GEMINI_CLI
from openenv_harness.harnesses.grok_cli import GROK_CLI
from openenv_harness.harnesses.mini_swe_agent import MINI_SWE_AGENT
from openenv_harness.harnesses.kilo import KILO
from openenv_harness.harnesses.opencode import OPENCODE
from openenv_harness.harnesses.pi import PI
from openenv_harness.harnesses.qwen_code import QWEN_CODE

#: Read-only: presets are fixed facts about pinned CLI versions, not runtime state.
PRESETS: Mapping[str, HarnessPreset] = MappingProxyType({preset.name: preset for preset in (
    PI, OPENCODE, CODEX, CLAUDE_CODE, GEMINI_CLI, GROK_CLI, KILO, CONTINUE, MINI_SWE_AGENT, QWEN_CODE, CLINE,
)})


class UnknownHarnessError(KeyError):
    """No preset has the requested name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown harness"


def get_preset(name: str) -> HarnessPreset:
    """The preset called ``name`` (``pi``, ``opencode``, ``codex``, ``claude-code``, ``gemini-cli``, ``mini-swe-agent``)."""
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise UnknownHarnessError(f"unknown harness {name!r}; known harnesses: {known}") from None


def list_presets() -> list[HarnessPreset]:
    """Every preset, sorted by name."""
    return [PRESETS[name] for name in sorted(PRESETS)]


def preset_names() -> list[str]:
    return sorted(PRESETS)
