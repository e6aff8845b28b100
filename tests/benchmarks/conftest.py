"""The benchmark scripts are plain files run as ``python benchmarks/<name>.py`` (not a package):
make them importable by their file names for these tests."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
