"""What a trainer keeps from one GRPO step to the next: fp32 master weights, the optimizer, a step count.

The engine serves bf16; the trainer learns in fp32. A step at a small learning rate changes most
weights by less than half a bf16 step -- a norm weight near 1.0 by 1e-4 against a bf16 spacing of
2^-7 -- so rounding the trainer's own weights to bf16 after a step would erase that update, and
every following step would start from weights the optimizer never produced. So the trained
parameters stay fp32 (the *master* weights) in the model, Adam's moments stay with them, and the
engine gets a bf16 *copy* (``served_tensors``, ``save_served``); a change accumulates in the master
until it survives rounding.

``TrainerState`` is that state as one object a multi-step loop holds: the model, its optimizer, the
names of the trained parameters and how many updates were taken. ``save_checkpoint`` /
``load_checkpoint`` write and read it (the trained parameters' master weights, the optimizer's
state, the step count; the frozen weights are the model folder's) so a loop can resume.

Trainer-side only (torch + transformers + safetensors).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from openenv_harness.trainer.grpo import StepReport, TrainSample, grpo_step, train_last_layers

CHECKPOINT_META = "trainer_state.json"
CHECKPOINT_MASTER = "master.safetensors"
CHECKPOINT_OPTIMIZER = "optimizer.pt"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into this trainer; the message says what does not match."""


class CheckpointMeta(BaseModel):
    """``trainer_state.json``: what the checkpoint holds, checked before anything is loaded."""

    model_config = ConfigDict(extra="forbid", strict=True)

    format: Literal[1] = 1
    step: int = Field(ge=0, description="Optimizer updates taken")
    layers: int = Field(ge=1, description="Decoder layers trained (the last ones, with the final norm)")
    learning_rate: float
    #: the norms' own learning rate (None: they train at ``learning_rate``)
    norm_learning_rate: float | None = None
    model_type: str = Field(description="The model's config.model_type")
    #: every trained parameter's name and shape, in the optimizer's order
    parameters: dict[str, list[int]]
    master_digest: str = Field(description="sha256 of the master weights (``weights_digest``)")


def _torch() -> Any:
    import torch

    return torch


def weights_digest(tensors: Mapping[str, Any]) -> str:
    """sha256 over the names and fp32 values of ``tensors``, in name order: equal digests, equal weights
    (a bf16 tensor hashes as its fp32 value, so a master equals its bf16 copy exactly when it is
    representable in bf16)."""
    torch = _torch()
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


@dataclass
class TrainerState:
    """The model with fp32 master weights for its trained parameters, their Adam, and the step count."""

    model: Any
    optimizer: Any
    #: the trained parameters by name, in the optimizer's order (the masters themselves, not copies)
    trained: dict[str, Any]
    layers: int
    step: int = 0

    @classmethod
    def create(cls, model: Any, *, layers: int, learning_rate: float,
               norm_learning_rate: float | None = None) -> TrainerState:
        """Train the last ``layers`` decoder layers and the final norm of ``model`` with Adam.

        The trained parameters must be fp32: a bf16 master would round every update away.
        ``norm_learning_rate`` gives the norm weights (RMSNorm) a learning rate of their own: they sit
        near 1-10 where projection weights sit near 0.02, so one Adam step of a given size is a far
        smaller share of a norm weight, and under half its bf16 spacing it reaches the engine only
        once the master has accumulated enough. The norms form the optimizer's second group."""
        torch = _torch()
        for name, rate in (("learning rate", learning_rate), ("norm learning rate", norm_learning_rate)):
            if rate is not None and not rate >= 0:
                raise ValueError(f"the {name} must be a non-negative number, got {rate}")
        train_last_layers(model, layers)
        trained = {name: p for name, p in model.named_parameters() if p.requires_grad}
        wrong = sorted(name for name, p in trained.items() if p.dtype != torch.float32)
        if wrong:
            raise ValueError(f"the trained parameters must be float32 master weights; {wrong[0]} is "
                             f"{trained[wrong[0]].dtype} (load the model with dtype float32)")
        if norm_learning_rate is None:
            optimizer = torch.optim.Adam(list(trained.values()), lr=learning_rate)
        else:
            norms = {id(p) for module in model.modules() if "norm" in type(module).__name__.lower()
                     for p in module.parameters(recurse=False)}
            rest = [p for p in trained.values() if id(p) not in norms]
            normed = [p for p in trained.values() if id(p) in norms]
            optimizer = torch.optim.Adam([{"params": rest, "lr": learning_rate},
                                          {"params": normed, "lr": norm_learning_rate}])
            order = {id(p): name for name, p in trained.items()}
            trained = {order[id(p)]: p for p in [*rest, *normed]}  # the optimizer's order
        model.eval()
        return cls(model, optimizer, trained, layers)

    def update(self, samples: Sequence[TrainSample], *, clip: float = 0.2, max_grad_norm: float = 1.0) -> StepReport:
        """One GRPO step on the masters; the step count moves only when the optimizer stepped."""
        report = grpo_step(self.model, self.optimizer, samples, clip=clip, max_grad_norm=max_grad_norm)
        if report.stepped:
            self.step += 1
        return report

    @property
    def adam_steps(self) -> int:
        """Adam's own step count on the trained parameters (0 before the first step): it grows with
        ``step`` only while the optimizer's state is carried over."""
        counts = {int(self.optimizer.state[p]["step"]) for p in self.trained.values() if "step" in self.optimizer.state[p]}
        return max(counts, default=0)

    def master_tensors(self) -> dict[str, Any]:
        """Detached copies of the master weights (fp32)."""
        return {name: p.detach().clone() for name, p in self.trained.items()}

    def served_tensors(self) -> dict[str, Any]:
        """The trained parameters as the engine will serve them: bf16 copies, the masters untouched."""
        torch = _torch()
        return {name: p.detach().to(torch.bfloat16, copy=True) for name, p in self.trained.items()}

    def master_digest(self) -> str:
        return weights_digest(self.trained)

    @contextmanager
    def scoring_with(self, tensors: Mapping[str, Any]) -> Iterator[Any]:
        """The model with the trained parameters' values taken from ``tensors`` (e.g. ``served_tensors()``,
        or an earlier step's) while the block runs; the masters are swapped back afterwards, never written."""
        missing = sorted(set(self.trained) - set(tensors))
        if missing:
            raise ValueError(f"no value for trained parameter {missing[0]} ({len(missing)} missing)")
        masters = {name: p.data for name, p in self.trained.items()}
        try:
            for name, p in self.trained.items():
                p.data = tensors[name].detach().to(device=masters[name].device, dtype=masters[name].dtype, copy=True)
            yield self.model
        finally:
            for name, p in self.trained.items():
                p.data = masters[name]

    def served(self) -> Any:
        """``scoring_with(served_tensors())``: the model exactly as the engine serves it after a sync."""
        return self.scoring_with(self.served_tensors())

    def save_served(self, folder: Path) -> None:
        """The whole model as bf16 safetensors for the engine to load (a tensor shared by two names, a
        tied embedding, stays one). Every tensor is converted into a new one: the fp32 masters in the
        model are read, never rounded in place."""
        torch = _torch()
        folder.mkdir(parents=True, exist_ok=True)
        converted: dict[int, Any] = {}
        state = {name: converted.setdefault(tensor.data_ptr(), tensor.detach().to(torch.bfloat16, copy=True))
                 for name, tensor in self.model.state_dict().items()}
        self.model.save_pretrained(str(folder), state_dict=state, safe_serialization=True)

    def save_checkpoint(self, folder: Path) -> Path:
        """Write the masters, the optimizer's state and the step to ``folder`` (its metadata last: a
        folder without ``trainer_state.json`` is an interrupted save, and is refused on load)."""
        torch = _torch()
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        meta_path = folder / CHECKPOINT_META
        meta_path.unlink(missing_ok=True)
        save_file({name: p.detach().contiguous() for name, p in self.trained.items()}, str(folder / CHECKPOINT_MASTER))
        torch.save(self.optimizer.state_dict(), str(folder / CHECKPOINT_OPTIMIZER))
        meta = CheckpointMeta(step=self.step, layers=self.layers,
                              learning_rate=float(self.optimizer.param_groups[0]["lr"]),
                              norm_learning_rate=(float(self.optimizer.param_groups[1]["lr"])
                                                  if len(self.optimizer.param_groups) > 1 else None),
                              model_type=str(getattr(self.model.config, "model_type", "")),
                              parameters={name: list(p.shape) for name, p in self.trained.items()},
                              master_digest=self.master_digest())
        temporary = folder / (CHECKPOINT_META + ".tmp")
        temporary.write_text(meta.model_dump_json(indent=2))
        temporary.replace(meta_path)
        return folder

    def load_checkpoint(self, folder: Path) -> None:
        """Load a checkpoint written by ``save_checkpoint`` into this state. Everything is read and
        checked against this model first; on any mismatch ``CheckpointError`` is raised and nothing
        here has changed. The optimizer's state comes back with its learning rate."""
        torch = _torch()
        from safetensors.torch import load_file

        meta_path = folder / CHECKPOINT_META
        if not meta_path.is_file():
            raise CheckpointError(f"no checkpoint at {folder} ({CHECKPOINT_META} missing: none written, or the save "
                                  "was interrupted)")
        try:
            meta = CheckpointMeta.model_validate(json.loads(meta_path.read_text()))
        except (ValidationError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{meta_path} is not a trainer checkpoint's metadata: {exc}") from exc
        ours = {name: list(p.shape) for name, p in self.trained.items()}
        model_type = str(getattr(self.model.config, "model_type", ""))
        if meta.model_type != model_type:
            raise CheckpointError(f"the checkpoint is of a {meta.model_type!r} model, this trainer's is {model_type!r}")
        if meta.layers != self.layers or meta.parameters != ours:
            differ = sorted(set(meta.parameters).symmetric_difference(ours)) or sorted(
                n for n in ours if meta.parameters.get(n) != ours[n])
            raise CheckpointError(f"the checkpoint trains {meta.layers} layer(s), this trainer {self.layers}; the "
                                  f"trained parameters differ ({differ[0] if differ else 'order'})")
        try:
            masters = load_file(str(folder / CHECKPOINT_MASTER))
            optimizer_state = torch.load(str(folder / CHECKPOINT_OPTIMIZER), weights_only=True)
        except (OSError, RuntimeError, ValueError) as exc:
            raise CheckpointError(f"the checkpoint at {folder} cannot be read: {exc}") from exc
        if set(masters) != set(ours):
            raise CheckpointError(f"{CHECKPOINT_MASTER} holds other tensors than {CHECKPOINT_META} lists")
        wrong = sorted(n for n, t in masters.items() if t.dtype != torch.float32 or list(t.shape) != ours[n])
        if wrong:
            raise CheckpointError(f"master weight {wrong[0]} is {masters[wrong[0]].dtype} {list(masters[wrong[0]].shape)}, "
                                  f"expected float32 {ours[wrong[0]]}")
        if weights_digest(masters) != meta.master_digest:
            raise CheckpointError(f"the master weights at {folder} do not match their recorded digest")
        saved_groups = optimizer_state.get("param_groups") if isinstance(optimizer_state, dict) else None
        if not saved_groups or sum(len(g["params"]) for g in saved_groups) != len(ours):
            raise CheckpointError(f"{CHECKPOINT_OPTIMIZER} is not the state of an optimizer over these parameters")
        before = self.optimizer.state_dict()
        try:
            self.optimizer.load_state_dict(optimizer_state)
        except (ValueError, KeyError) as exc:
            self.optimizer.load_state_dict(before)
            raise CheckpointError(f"the optimizer's state at {folder} does not fit: {exc}") from exc
        with torch.no_grad():
            for name, p in self.trained.items():
                p.copy_(masters[name])
        self.step = meta.step
