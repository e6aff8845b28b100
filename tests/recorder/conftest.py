"""Recorder test fixtures: the reference engine and a recorder, both on real loopback HTTP."""

from __future__ import annotations

from openenv_harness.testing.recorder_fixtures import admin_fixture, engine_fixture, recorder_fixture

from agentloop import ADMIN
from refused_bodies import LIMIT

engine = engine_fixture()
recorder = recorder_fixture(ADMIN)
#: a recorder with a 64 KiB request body limit, for the size-limit tests
small_recorder = recorder_fixture(ADMIN, name="small_recorder", max_body_bytes=LIMIT)
admin = admin_fixture(ADMIN)
