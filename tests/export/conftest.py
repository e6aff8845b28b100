"""Fixtures of the export tests."""

from __future__ import annotations

import pytest
from export_records import Records


@pytest.fixture
def session() -> Records:
    return Records()
