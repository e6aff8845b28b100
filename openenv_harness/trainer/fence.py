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

With several recorders in front of the same engines (``docs/scale-out.md``) the first one pauses
and resumes the engines (every replica: its ``engine_replicas``) and the others only close and open
their fences around it. Their version is advanced *before* the engines resume and their fences
open after, so a call kept across the sync on any recorder ends at the new version
(``straddled_sync``) and every recorder then serves one version.
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
        others: list[RecorderClient] | None = None,
    ) -> None:
        if mode not in ("keep", "wait", "abort"):
            raise ValueError(f"pause mode must be keep, wait or abort; got {mode!r}")
        self._engine_client = engine_client
        self.recorder = recorder
        #: further recorders in front of the same engines: fenced around the first one's sync
        self.others = list(others or [])
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
        closed: list[RecorderClient] = []
        try:
            for other in self.others:
                other.fence_pause()
                closed.append(other)
            self.recorder.pause_engine(self.mode)
        except BaseException:
            for other in closed:  # no sync happens: their fences open again, versions unchanged
                other.fence_resume(bump=False)
            raise

    def resume(self, timeout: float | None = None) -> None:
        """Pin the pre-sync version, then resume: the recorder bumps it as it reopens the fence
        (the other recorders are advanced to that version first and opened after)."""
        self.pin_version()
        if self.others:
            after = self.policy_version() + 1
            for other in self.others:
                other.set_policy_version(after)
        self.recorder.resume_engine()
        for other in self.others:
            other.fence_resume(bump=False)
        self.syncs += 1

    def pin_version(self) -> None:
        """Set every recorder's policy version to the trainer's (no-op without ``current_version``)."""
        if self.current_version is not None:
            for recorder in (self.recorder, *self.others):
                recorder.set_policy_version(int(self.current_version()))

    def policy_version(self) -> int:
        """The recorder's current policy version."""
        return int(self.recorder.health()["fence"]["policy_version"])

    def close(self) -> None:
        for recorder in (self.recorder, *self.others):
            recorder.close()


def install_recorder_fence(
    trainer: Any,
    recorder_url: str | list[str],
    admin_token: str,
    *,
    mode: str = "keep",
    control_timeout_s: float = CONTROL_TIMEOUT_S,
) -> RecorderFencedEngine | None:
    """Make an ``AsyncGRPOTrainer`` fence its weight syncs through the recorder.

    Replaces ``trainer.vllm_client`` (LoRA sync) and ``trainer.weight_transfer.vllm`` (merged
    sync) with one ``RecorderFencedEngine``; the trainer's ``model_version`` is read now (calls
    served before the first sync carry it) and at each resume. Returns ``None`` on processes
    without an engine client (non-main ranks). Several recorder URLs: the first pauses the engines,
    the others fence around it.
    """
    engine_client = getattr(trainer, "vllm_client", None)
    if engine_client is None:
        return None
    if isinstance(engine_client, RecorderFencedEngine):
        return engine_client
    urls = [recorder_url] if isinstance(recorder_url, str) else list(recorder_url)
    clients = [RecorderClient(url, admin_token, timeout_s=control_timeout_s) for url in urls]
    fenced = RecorderFencedEngine(
        engine_client,
        clients[0],
        mode=mode,
        current_version=lambda: int(trainer.model_version),
        others=clients[1:],
    )
    fenced.pin_version()
    trainer.vllm_client = fenced
    transfer = getattr(trainer, "weight_transfer", None)
    if transfer is not None and hasattr(transfer, "vllm"):
        transfer.vllm = fenced
    return fenced
