"""A placeholder ``torchvision`` for SGLang's CPU venv: it imports, and any use of it raises.

Copied into that venv as ``torchvision/__init__.py`` by ``sglang_cpu.install_sglang``. Why it exists:
SGLang imports torchvision at start-up (its vision model configs and image processors are imported
even to serve a text model), but PyPI carries torchvision only as builds linked against CUDA torch.
Beside the CPU torch the venv runs on, their compiled ops do not load and ``import torchvision``
fails ("operator torchvision::nms does not exist"); PyPI has no CPU build, and the CUDA torch that
would load them costs the venv about 5 GB of CUDA libraries this engine never calls.

A text model never calls torchvision. Every name under this package (any submodule, any attribute,
any depth) is a placeholder; calling one, or instantiating a class derived from one, raises
``TorchvisionAbsent`` naming it, so a vision model served through this venv fails loudly instead of
computing with something that is not torchvision.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any

#: a version no real torchvision has, so a ``>=`` check on it answers "too old", never "capable"
__version__ = "0+placeholder"


class TorchvisionAbsent(RuntimeError):
    """A placeholder torchvision name was used: this venv has no torchvision."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{name}: torchvision is not installed in SGLang's CPU venv (a placeholder "
                         "stands in for it so SGLang imports; text models never use it)")


class _Absent:
    """Any attribute of a placeholder: more placeholders, and an error on use."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Absent:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TorchvisionAbsent(self._name)

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        # ``class Resize(T.Resize)`` at import time: the subclass exists, making one raises
        return (_absent_class(self._name),)

    def __repr__(self) -> str:
        return f"<torchvision placeholder {self._name}>"


def _absent_class(name: str) -> type:
    def refuse(self: object, *args: Any, **kwargs: Any) -> None:
        raise TorchvisionAbsent(name)

    return type(name.rsplit(".", 1)[-1], (), {"__init__": refuse})


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, attr: str) -> _Absent:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self.__name__}.{attr}")


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``import torchvision.<anything>`` with a placeholder module."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self.package + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _PlaceholderModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def __getattr__(attr: str) -> _Absent:
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Absent(f"{__name__}.{attr}")


if not any(getattr(finder, "package", None) == __name__ for finder in sys.meta_path):
    sys.meta_path.insert(0, _SubmoduleFinder(__name__))
