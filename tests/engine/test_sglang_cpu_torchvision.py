"""The placeholder torchvision SGLang's CPU venv carries: everything imports, nothing can be used.

Loaded from its file under a name of its own, so the test process's own torchvision (if any) is not
shadowed; its submodule finder answers only below that name. The real SGLang importing with it is
checked by the real-engine tier (``tests/real_engine/test_real_sglang_server.py``)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from openenv_harness.engine import sglang_cpu

NAME = "placeholder_torchvision_under_test"


@pytest.fixture
def placeholder() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location(NAME, sglang_cpu.TORCHVISION_PLACEHOLDER,
                                                  submodule_search_locations=[])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module
    before = list(sys.meta_path)
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        sys.meta_path[:] = before
        for name in [n for n in sys.modules if n == NAME or n.startswith(NAME + ".")]:
            del sys.modules[name]


def test_any_submodule_imports_as_sglang_imports_them(placeholder: ModuleType) -> None:
    transforms = importlib.import_module(f"{NAME}.transforms")
    functional = importlib.import_module(f"{NAME}.transforms.v2.functional")
    assert transforms.__name__ == f"{NAME}.transforms"
    assert functional.__name__ == f"{NAME}.transforms.v2.functional"
    # ``from torchvision.transforms.functional import InterpolationMode`` then ``.BICUBIC`` at class level
    mode = importlib.import_module(f"{NAME}.transforms.functional").InterpolationMode.BICUBIC
    assert repr(mode) == f"<torchvision placeholder {NAME}.transforms.functional.InterpolationMode.BICUBIC>"


def test_calling_anything_raises_naming_what_was_called(placeholder: ModuleType) -> None:
    transforms = importlib.import_module(f"{NAME}.transforms")
    with pytest.raises(placeholder.TorchvisionAbsent, match=rf"{NAME}\.transforms\.Resize: torchvision is not installed"):
        transforms.Resize(224)
    with pytest.raises(RuntimeError, match=r"ops\.nms"):
        placeholder.ops.nms(1, 2, 0.5)


def test_a_class_derived_from_a_placeholder_is_defined_and_cannot_be_made(placeholder: ModuleType) -> None:
    transforms = importlib.import_module(f"{NAME}.transforms")

    class Resize(transforms.Resize):  # type: ignore[misc,name-defined]
        pass

    with pytest.raises(placeholder.TorchvisionAbsent, match=r"transforms\.Resize"):
        Resize(224)


def test_dunder_lookups_stay_missing_so_introspection_does_not_take_it_for_a_value(placeholder: ModuleType) -> None:
    with pytest.raises(AttributeError):
        placeholder.__wrapped__  # noqa: B018
    with pytest.raises(AttributeError):
        placeholder.transforms.__array__  # noqa: B018
    assert placeholder.__version__ == "0+placeholder"


def test_the_finder_answers_only_below_its_own_name(placeholder: ModuleType) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"{NAME}_sibling.transforms")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("no_such_package_anywhere")


def test_loading_it_twice_installs_one_finder(placeholder: ModuleType) -> None:
    spec = importlib.util.spec_from_file_location(NAME, sglang_cpu.TORCHVISION_PLACEHOLDER,
                                                  submodule_search_locations=[])
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    finders = [f for f in sys.meta_path if type(f).__name__ == "_SubmoduleFinder"]
    assert len(finders) == 1
