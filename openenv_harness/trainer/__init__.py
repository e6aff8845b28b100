"""Trainer-side helpers: what a trainer process needs from this package besides its rollouts.

- ``template_fingerprint``: the fingerprint of the chat template the trainer trains with, to be
  compared by the recorder with the template the engine serves (a mismatch fails session creation).
- ``install_recorder_fence`` / ``RecorderFencedEngine``: route TRL's weight-sync pause/resume
  through the recorder, so every record carries the policy version that served it.

Nothing here imports TRL, torch or OpenEnv: the helpers take the trainer's objects as they are.
"""

from openenv_harness.trainer.fence import CONTROL_TIMEOUT_S, RecorderFencedEngine, install_recorder_fence
from openenv_harness.trainer.template import (
    TemplateFingerprintError,
    engine_view,
    probe_token_ids,
    template_fingerprint,
)

__all__ = [
    "CONTROL_TIMEOUT_S", "RecorderFencedEngine", "TemplateFingerprintError", "engine_view",
    "install_recorder_fence", "probe_token_ids", "template_fingerprint",
]
