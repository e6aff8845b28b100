"""Route a trainer's weight-sync fence through the recorder (D12), leaving the weight transfer alone.

TRL's ``AsyncGRPOTrainer`` fences every weight update with ``POST /pause?mode=keep`` and
``POST /resume`` on vLLM, through one ``VLLMClient`` it shares with its ``WeightTransferClient``
(merged sync: ``weight_transfer.vllm.pause()``; LoRA sync: ``trainer.vllm_client.pause()``). Sent
straight to vLLM, those calls leave the recorder blind: it cannot hold new agent calls at its own
door, and it cannot tell which policy served a call. ``RecorderFencedEngine`` wraps that client so
that ``pause``/``resume`` go to the recorder's ``/admin/engine/pause|resume`` (the recorder closes
its fence, pauses the engine itself, and bumps its policy version on resume), while every other
call -- NCCL setup, ``/update_weights``, adapter loading, ``/v1/models`` -- still goes to vLLM
unchanged.

The recorder's version is set to the trainer's ``model_version`` while paused, then bumped by the
resume: so it equals the version TRL stamps on its rollouts after every sync, including after a
resume from a checkpoint (where TRL restarts counting from the saved version).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from openenv_harness.recorder.client import RecorderClient

#: TRL bounds pause/resume by this many seconds (``WeightTransferClient._CONTROL_TIMEOUT``).
CONTROL_TIMEOUT_S = 300.0


class RecorderFencedEngine:
    """An engine-control client whose ``pause``/``resume`` are the recorder's fence routes.

    ``engine_client`` is the client being wrapped (TRL's ``VLLMClient``); any attribute this class
    does not define is read from it, so the wrapper can stand wherever TRL expects that client.
    ``current_version`` returns the trainer's policy version *before* the sync being fenced.
    """

    def __init__(
        self,
        engine_client: Any,
        recorder: RecorderClient,
        *,
        mode: str = "keep",
        current_version: Callable[[], int] | None = None,
    ) -> None:
        if mode not in ("keep", "wait", "abort"):
            raise ValueError(f"pause mode must be keep, wait or abort; got {mode!r}")
        self._engine_client = engine_client
        self.recorder = recorder
        self.mode = mode
        self.current_version = current_version
        self.syncs = 0

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes this object lacks: everything but the fence goes to the engine.
        if name.startswith("__") or name == "_engine_client":
            raise AttributeError(name)
        return getattr(self._engine_client, name)

    @property
    def engine_client(self) -> Any:
        return self._engine_client

    def pause(self, timeout: float | None = None) -> None:
        """Close the recorder's fence and pause the engine (raises ``RecorderAPIError`` if it cannot).

        ``timeout`` is accepted for TRL's call signature; the recorder client's own timeout bounds the call.
        """
        self.recorder.pause_engine(self.mode)

    def resume(self, timeout: float | None = None) -> None:
        """Pin the pre-sync version, then resume: the recorder bumps it as it reopens the fence."""
        self.pin_version()
        self.recorder.resume_engine()
        self.syncs += 1

    def pin_version(self) -> None:
        """Set the recorder's policy version to the trainer's (no-op without ``current_version``)."""
        if self.current_version is not None:
            self.recorder.set_policy_version(int(self.current_version()))

    def policy_version(self) -> int:
        """The recorder's current policy version."""
        return int(self.recorder.health()["fence"]["policy_version"])

    def close(self) -> None:
        self.recorder.close()


def install_recorder_fence(
    trainer: Any,
    recorder_url: str,
    admin_token: str,
    *,
    mode: str = "keep",
    control_timeout_s: float = CONTROL_TIMEOUT_S,
) -> RecorderFencedEngine | None:
    """Make an ``AsyncGRPOTrainer`` fence its weight syncs through the recorder.

    Replaces ``trainer.vllm_client`` (LoRA sync) and ``trainer.weight_transfer.vllm`` (merged
    sync) with one ``RecorderFencedEngine``; the trainer's ``model_version`` is read now (calls
    served before the first sync carry it) and at each resume. Returns ``None`` on processes
    without an engine client (non-main ranks).
    """
    engine_client = getattr(trainer, "vllm_client", None)
    if engine_client is None:
        return None
    if isinstance(engine_client, RecorderFencedEngine):
        return engine_client
    fenced = RecorderFencedEngine(
        engine_client,
        RecorderClient(recorder_url, admin_token, timeout_s=control_timeout_s),
        mode=mode,
        current_version=lambda: int(trainer.model_version),
    )
    fenced.pin_version()
    trainer.vllm_client = fenced
    transfer = getattr(trainer, "weight_transfer", None)
    if transfer is not None and hasattr(transfer, "vllm"):
        transfer.vllm = fenced
    return fenced
