"""Step: the engine's reply becomes token evidence (``recorder/validate.py`` says what makes it valid)."""

from __future__ import annotations

from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.validate import extract_evidence


def validate(flow: Flow) -> None:
    assert flow.reply is not None and flow.reply.json is not None
    flow.evidence = extract_evidence(flow.reply.json, flow.prompt_ids)
    flow.evidence.reasons.extend(flow.reply.doubts)
