"""Incremental mode on an engine whose only exact-ids route is ``/v1/completions`` with an id prompt."""

from __future__ import annotations

from pathlib import Path

import pytest

from openenv_harness.recorder import RecorderClient, RecorderConfig, RecorderServer
from openenv_harness.recorder.prompt_modes.id_sampling import NotExpressible, as_generate_response, completion_body
from openenv_harness.testing.engine import EngineConfig, EngineServer

from agentloop import ADMIN, run_agent, tool_script


def test_continued_calls_sample_through_id_prompt_completions_exactly(tmp_path: Path) -> None:
    with EngineServer(EngineConfig(generate_route=False)) as engine, RecorderServer(RecorderConfig(
            store_path=str(tmp_path / "r.db"), engine_url=engine.url, admin_token=ADMIN)) as rec, \
            RecorderClient(rec.url, ADMIN) as admin:
        s = admin.create_session(prompt_mode="incremental", prompt_mode_strict=True)
        engine.set_script(s["session_id"], tool_script(3, spaced_args=True))
        run_agent(s["base_url"], s["secret"], stream=True, echo="pi")
        records = admin.records(s["session_id"])
        assert [r["metadata"]["fidelity"]["class"] for r in records] == ["root", "exact", "exact", "exact"]
        modes = [r["metadata"]["prompt_mode"] for r in records[1:]]
        assert all(m["continued"] and m["sampled_via"] == "/v1/completions" for m in modes)
        sampled = [(e["path"], e["sampled"]) for e in engine.requests(s["session_id"]) if "sampled" in e]
        assert [path for path, _ in sampled] == ["/v1/chat/completions"] + ["/v1/completions"] * 3
        # what is recorded is exactly what the engine sampled from and sampled, with its logprobs
        assert [r["prompt_token_ids"] for r in records] == [x["prompt_token_ids"] for _, x in sampled]
        assert [r["completion_token_ids"] for r in records] == [x["token_ids"] for _, x in sampled]
        assert [r["per_token_logps"] for r in records] == [x["logprobs"] for _, x in sampled]
        for prev, r in zip(records, records[1:]):
            chain = prev["prompt_token_ids"] + prev["completion_token_ids"]
            assert r["prompt_token_ids"][:len(chain)] == chain
        # the engine's parsers (derender) made the replies: tool calls and the final answer
        assert records[1]["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "bash"
        assert records[-1]["response"]["choices"][0]["message"]["content"] == "All done."


def test_sampling_parameters_map_by_name_or_refuse() -> None:
    body = completion_body([1, 2], {"temperature": 0.7, "max_tokens": 9, "logprobs": 0, "output_kind": 2,
                                    "stop_token_ids": [5], "top_k": None}, "m")
    assert body["prompt"] == [1, 2] and body["temperature"] == 0.7 and body["max_tokens"] == 9
    assert body["return_token_ids"] and body["return_tokens_as_token_ids"] and body["skip_special_tokens"] is False
    assert "output_kind" not in body and "top_k" not in body and body["model"] == "m"
    with pytest.raises(NotExpressible, match="guided_choice"):
        completion_body([1], {"guided_choice": ["a"]}, None)


def test_a_completion_reply_reads_as_a_generate_reply() -> None:
    reply = {"id": "cmpl-1", "choices": [{"finish_reason": "stop", "token_ids": None, "logprobs": {
        "tokens": ["token_id:7", "token_id:9"], "token_logprobs": [-0.5, -1.0],
        "top_logprobs": [{"token_id:7": -0.5, "token_id:3": -2.0}, {"token_id:9": -1.0}]}}]}
    choice = as_generate_response(reply)["choices"][0]  # type: ignore[index]
    assert choice["token_ids"] == [7, 9]
    assert choice["logprobs"]["content"][0] == {"token_id": 7, "logprob": -0.5, "top_logprobs": [
        {"token_id": 7, "logprob": -0.5}, {"token_id": 3, "logprob": -2.0}]}
    assert as_generate_response({"choices": [{"token_ids": None, "logprobs": {"tokens": ["ab"]}}]}) is None


def test_the_route_is_probed_once_per_engine() -> None:
    import asyncio

    from openenv_harness.recorder.prompt_modes.engine_facts import EngineFactsTable
    from openenv_harness.recorder.prompt_modes.id_sampling import COMPLETIONS, GENERATE, sampler_for
    from openenv_harness.recorder.upstream.base import Upstream, UpstreamReply

    class Counting(Upstream):
        def __init__(self, status: int) -> None:
            self.status, self.probes = status, 0

        async def chat(self, body: dict, *, session_id: str, affinity: str | None = None) -> UpstreamReply:
            raise AssertionError("no chat call expected")

        async def request(self, method: str, path: str, *, json: object = None,
                          params: dict[str, str] | None = None) -> UpstreamReply:
            self.probes += 1
            await asyncio.sleep(0)
            return UpstreamReply(status=self.status, json=None)

    facts = EngineFactsTable()

    async def routes(engine: Counting) -> list[str]:
        return [s.route for s in await asyncio.gather(*(sampler_for(engine, facts.of(engine)) for _ in range(5)))]

    with_generate, without = Counting(400), Counting(404)
    assert asyncio.run(routes(with_generate)) == [GENERATE] * 5
    assert asyncio.run(routes(without)) == [COMPLETIONS] * 5
    assert with_generate.probes == without.probes == 1
