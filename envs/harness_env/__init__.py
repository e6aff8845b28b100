"""harness_env: an OpenEnv environment whose episodes are rollouts of real coding agents."""

from .client import HarnessEnv, fetch_records, records_url
from .models import HarnessObservation, HarnessState, RecordsLocation, RunAgent, TraceSummary

__all__ = [
    "HarnessEnv",
    "HarnessObservation",
    "HarnessState",
    "RecordsLocation",
    "RunAgent",
    "TraceSummary",
    "fetch_records",
    "records_url",
]
