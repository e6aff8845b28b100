"""The recorder's log line for the served template says what was found, how, and why it probed, and
marks an informational property that fails as a note -- never a FAIL beside 'certified'."""

from __future__ import annotations

import logging

import pytest

from openenv_harness.recorder import RecorderClient


def test_the_template_log_line_reads_as_the_doctor_does(admin: RecorderClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="openenv_harness.recorder"):
        admin._call("POST", "/admin/engine/reprobe")
    [line] = [r.getMessage() for r in caplog.records if "served template" in r.getMessage()]
    head, *properties = line.splitlines()
    assert head.startswith("recorder: served template certified (exact in both prompt modes), probed via render (probe: ")
    assert properties and all(" (required): " in p or " (info): " in p for p in properties)
    assert not any("FAIL" in p for p in properties), "a certified template fails no required property"
    assert any("(info): note" in p for p in properties), "the reference template's argument round trip is a note"
