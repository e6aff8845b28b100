"""The capture proxy's view of what the recorder forwarded for agents, on the reference engine (no vLLM).

A tier of rollouts longer than the recorder's ``template_reprobe_s`` sees the recorder probe the engine
again when a session is created: its logprobs-mode measurement is two chat calls of its own. Those are
not samples of any record and must not be matched against records as if they were."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from capture_proxy import CaptureProxy
from real_stack import RealStack
from openenv_harness.testing.engine import EngineServer


def test_the_recorders_own_probes_are_not_taken_for_an_agents_samples(tmp_path: Path) -> None:
    with EngineServer() as engine:
        capture = CaptureProxy(engine.url).start()
        stack = RealStack(tmp_path / "records.db", capture.url, template_reprobe_s=0.5)
        try:
            capture.clear()
            time.sleep(1.0)
            session_id, secret = stack.session()  # what the recorder knows is stale: it probes again
            probes = capture.chat_exchanges()
            assert len(probes) == 2 and capture.sampled_chat_exchanges() == []
            assert all("return_token_ids" not in p.request_json() for p in probes)
            reply = httpx.post(f"{stack.recorder.url}/rollout/{session_id}/v1/chat/completions",
                               json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                               headers={"authorization": f"Bearer {secret}"}, timeout=30)
            assert reply.status_code == 200, reply.text
            [sampled] = capture.sampled_chat_exchanges()
            [record] = stack.admin.records(session_id)
            assert sampled.reply_json()["prompt_token_ids"] == record["prompt_token_ids"]
        finally:
            stack.close()
            capture.stop()
