"""The prompt modes a session may name (``SessionSpec.prompt_mode``). Stateless: what a mode keeps
lives on the session (``LiveSession.prompt_mode_state``) and the context (``engine_facts``)."""

from __future__ import annotations

from openenv_harness.recorder.prompt_modes.base import PromptMode
from openenv_harness.recorder.prompt_modes.full_history import FullHistory
from openenv_harness.recorder.prompt_modes.incremental import Incremental

PROMPT_MODES: dict[str, PromptMode] = {mode.name: mode for mode in (FullHistory(), Incremental())}


def mode_for(name: str) -> PromptMode:
    return PROMPT_MODES[name]
