"""The token-count routes alone: an engine that cannot count answers 501 in each dialect's error shape,
and a count is never recorded. (That a count is the prompt length of the call the same body makes is
checked with each dialect: ``tests/recorder/dialects/``.)"""

from __future__ import annotations

from pathlib import Path

import httpx

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.upstream.base import Upstream, UpstreamFailure, UpstreamReply

from agentloop import ADMIN


class _NoTokenizer(Upstream):
    """A test double for an upstream with no ``/tokenize`` (like the white-box ``ModelStep``): its
    ``request`` is the base class's, which says the route is not there."""

    name = "no-tokenizer"

    async def chat(self, body: dict, *, session_id: str, affinity: str | None = None) -> UpstreamReply:
        raise UpstreamFailure("connect", "not used here")


def test_an_engine_without_a_tokenizer_is_a_501_in_each_dialects_shape(tmp_path: Path) -> None:
    config = RecorderConfig(store_path=str(tmp_path / "r.db"), admin_token=ADMIN, probe_template=False,
                            probe_logprobs_mode=False)
    with RecorderServer(config, upstreams={"default": _NoTokenizer()}) as server, \
            RecorderClient(server.url, ADMIN) as admin:
        s = admin.create_session()
        anthropic = httpx.post(f"{server.url}/v1/messages/count_tokens", headers={"x-api-key": s["secret"]},
                               json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        # Claude Code then counts another way
        assert anthropic.status_code == 501 and anthropic.json()["error"]["type"] == "api_error"
        google = httpx.post(f"{server.url}/rollout/{s['session_id']}/v1beta/models/policy:countTokens",
                            headers={"x-goog-api-key": s["secret"]},
                            json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
        # Gemini CLI falls back to its own estimate
        assert google.status_code == 501 and google.json()["error"]["status"] == "UNIMPLEMENTED"
        assert admin.records(s["session_id"]) == [] and admin.session(s["session_id"])["calls"] == 0
