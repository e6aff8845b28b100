"""Raw and processed logprobs on the real vLLM: measured by the recorder, and what each trains.

The tier's shared vLLM runs with vLLM's default (``raw_logprobs``); a second one here runs with
``--logprobs-mode processed_logprobs`` (what TRL's ``trl vllm-serve`` starts). On each: the recorder
measures the mode (not a flag), records it on every call, and a training sampling policy at
temperature 0.7 is refused on the raw engine and served on the processed one -- where the trainer's
own logprobs at the recorded temperature meet the step-0 limits and its plain (temperature 1)
logprobs do not.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from openenv_harness.engine import VLLMServer
from openenv_harness.recorder import RecorderAPIError
from openenv_harness.trainer.limits import DEFAULT_LIMITS
from openenv_harness.trainer.sampling import RecordedSampling, require_reproducible
from openenv_harness.trainer.verify import DeltaStats, load_model, score_tokens
from real_stack import MODEL, RealStack, engine_parts, start_vllm

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

#: an open question with many likely continuations: a temperature changes its logprobs visibly
PROMPT = [{"role": "system", "content": "You are a coding agent."},
          {"role": "user", "content": "Write a short Python function that checks whether a number is prime, "
                                      "and explain it in two sentences."}]


@pytest.fixture(scope="module")
def processed_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    server = start_vllm(tmp_path_factory.mktemp("vllm-processed"), logprobs_mode="processed_logprobs", kv_cache_gib=1)
    try:
        yield server
    finally:
        server.stop()


#: an agent's call offers tools (a call without any is classified auxiliary, never trained)
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def _record(stack: RealStack, policy_temperature: float, **agent: Any) -> dict[str, Any]:
    session_id, secret = stack.session(training_sampling={"temperature": policy_temperature})
    reply = stack.chat(session_id, secret, {"model": MODEL, "messages": PROMPT, "tools": TOOLS, "max_tokens": 48,
                                            **agent})
    assert reply.status_code == 200, reply.text
    [record] = stack.admin.records(session_id)
    return record


def test_the_raw_engine_is_measured_raw_and_refuses_a_temperature_it_cannot_serve(vllm: VLLMServer,
                                                                                  tmp_path: Path) -> None:
    stack = RealStack(tmp_path / "records.db", vllm.url)
    try:
        engine = stack.admin.health()["engine"]
        assert engine["logprobs_mode"] == "raw_logprobs", engine.get("logprobs_mode_measure")
        with pytest.raises(RecorderAPIError) as refused:
            stack.session(training_sampling={"temperature": 0.7})
        assert refused.value.status == 409 and "processed_logprobs" in refused.value.message
        record = _record(stack, 1.0, top_p=0.8, top_k=20)
        prov = record["metadata"]["provenance"]
        assert (prov["logprobs_mode"], prov["logprobs_mode_source"]) == ("raw_logprobs", "measured")
        assert prov["sampling_neutralised"] == {"top_p": 0.8, "top_k": 20}
        assert record["metadata"]["call_kind"] == "agent" and record["metadata"]["status"] == "ok"
        assert prov["sampling_effective"]["top_p"] == 1.0 and record["metadata"]["trainable"] is True
    finally:
        stack.close()


def test_processed_logprobs_train_at_the_recorded_temperature(processed_vllm: VLLMServer, tmp_path: Path) -> None:
    stack = RealStack(tmp_path / "records.db", processed_vllm.url)
    try:
        engine = stack.admin.health()["engine"]
        assert engine["logprobs_mode"] == "processed_logprobs", engine.get("logprobs_mode_measure")
        record = _record(stack, 0.7, temperature=1.3, top_p=0.9)
    finally:
        stack.close()
    md = record["metadata"]
    assert md["call_kind"] == "agent" and md["status"] == "ok"
    assert md["provenance"]["logprobs_mode"] == "processed_logprobs" and md["trainable"] is True
    assert md["provenance"]["sampling_effective"]["temperature"] == 0.7
    sampling = require_reproducible([record])[md["node_id"]]
    assert sampling == RecordedSampling.of(record) and sampling.temperature_divisor == 0.7
    model, _tokenizer = load_model(str(engine_parts()[1]), dtype="float32")
    rollout = list(record["per_token_logps"])
    at_recorded = DeltaStats.of(rollout, score_tokens(model, record["prompt_token_ids"],
                                                      record["completion_token_ids"], temperature=0.7), 0.05)
    plain = DeltaStats.of(rollout, score_tokens(model, record["prompt_token_ids"], record["completion_token_ids"]),
                          0.05)
    print(f"processed logprobs at T=0.7: scored at 0.7 {at_recorded}; scored at 1 {plain}")
    assert not DEFAULT_LIMITS.failures(at_recorded), DEFAULT_LIMITS.failures(at_recorded)
    assert DEFAULT_LIMITS.failures(plain), "the logprobs of another temperature must fail the limits"
