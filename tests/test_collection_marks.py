"""The collection hook of ``tests/conftest.py``: a file is left unimported only when ``-m`` rules out
every test it could hold."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

FAST_TIER = "not real_engine and not cli and not slow"


def _conftest() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tests_root_conftest", Path(__file__).with_name("conftest.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_module_marks_are_read_without_importing_the_file() -> None:
    marks = _conftest().module_marks
    assert marks("import pytest\npytestmark = pytest.mark.cli\n") == {"cli"}
    assert marks("pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(900)]\n") == {
        "real_engine", "slow", "timeout"}
    assert marks("import pytest\n\ndef test_x():\n    pytestmark = pytest.mark.cli\n") is None  # not module level
    assert marks("x = 1\n") is None
    assert marks("def broken(:\n") is None


@pytest.mark.parametrize(("expr", "marks", "excluded"), [
    (FAST_TIER, {"real_engine", "slow"}, True),
    (FAST_TIER, {"cli"}, True),
    (FAST_TIER, {"compat"}, False),
    (FAST_TIER, set(), False),
    ("slow", {"cli"}, False),  # a test in the file may carry slow itself
    ("cli and not slow", {"cli"}, False),
    ("cli and not slow", {"slow"}, True),
    ("not (cli or slow)", {"slow"}, True),
    ("real_engine or cli", {"slow"}, False),
    ("cli(kind='x')", {"cli"}, False),  # keyword matching: not read, so never excluded here
    ("not", set(), False),  # not an expression: pytest reports it; the hook keeps out of the way
])
def test_a_file_is_excluded_only_when_no_test_in_it_could_match(expr: str, marks: set[str], excluded: bool) -> None:
    assert _conftest().excluded_whatever_else(expr, marks) is excluded


def test_the_fast_tier_collects_the_same_tests_without_importing_the_excluded_files(tmp_path: Path) -> None:
    """The same selection as pytest's own deselection, in a tree made for it: one file ruled out by its
    marks (whose import would fail, so importing it shows), one kept."""
    (tmp_path / "conftest.py").write_text(Path(__file__).with_name("conftest.py").read_text())
    (tmp_path / "test_engine.py").write_text(
        "import pytest\npytestmark = [pytest.mark.real_engine, pytest.mark.slow]\n"
        "raise RuntimeError('imported')\n\ndef test_never():\n    pass\n")
    (tmp_path / "test_plain.py").write_text(
        "import pytest\n\ndef test_fast():\n    pass\n\n@pytest.mark.slow\ndef test_slow():\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n  real_engine: x\n  cli: x\n  slow: x\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                          "-m", FAST_TIER, str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "test_plain.py::test_fast" in run.stdout and "test_slow" not in run.stdout
    assert "test_never" not in run.stdout and "imported" not in run.stdout
    everything = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                                 str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)
    assert "RuntimeError: imported" in everything.stdout  # without -m the file is imported as always
