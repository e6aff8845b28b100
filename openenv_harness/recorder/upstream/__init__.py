"""Upstream engines the recorder forwards to."""

from openenv_harness.recorder.upstream.base import Upstream, UpstreamFailure, UpstreamReply
from openenv_harness.recorder.upstream.http import SESSION_HEADER, HTTPEngine, normalize_engine_url

__all__ = ["SESSION_HEADER", "HTTPEngine", "Upstream", "UpstreamFailure", "UpstreamReply", "normalize_engine_url"]
