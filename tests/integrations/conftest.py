"""Fixtures for the verifiers bridge tests: the reference engine and a recorder on loopback HTTP."""

from __future__ import annotations

from recorded_sessions import ADMIN

from openenv_harness.testing.recorder_fixtures import admin_fixture, engine_fixture, recorder_fixture


engine = engine_fixture()
recorder = recorder_fixture(ADMIN, scope="module")
admin = admin_fixture(ADMIN, scope="module")
