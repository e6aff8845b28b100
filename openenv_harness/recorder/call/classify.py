"""Step: an agent call (a policy sample of the main loop) or an auxiliary one (a title, a summary),
by the session's rules (``recorder/classify.py``)."""

from __future__ import annotations

from openenv_harness.recorder.call.flow import Flow
from openenv_harness.recorder.classify import classify_call


def classify(flow: Flow) -> None:
    flow.call_kind, flow.aux_rule = classify_call(flow.body, flow.session.spec.aux_rules)
