"""RFC 005 white-box mode on the real model: the real Pi runs while a ModelStep of this test's own
renders with the real Qwen2.5 tokenizer and samples from the real vLLM through ``/v1/completions``
with an id prompt. What the ModelStep returned is exactly what the recorder stored and the result carries."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openenv.core.env_server.mcp_types import Tool
from openenv.core.harness import HarnessRunLimits, ModelStepResult
from openenv.core.llm_client import LLMResponse

from real_stack import MODEL
from openenv_harness.contract import is_training_entry
from openenv_harness.engine import VLLMServer
from openenv_harness.rollout import BUILTIN_TASKS, AgentCLIAdapter, TaskSession
from openenv_harness.trainer.verify import _message_level

pytestmark = [pytest.mark.real_engine, pytest.mark.cli, pytest.mark.slow]


class VLLMModelStep:
    """The trainer's sampler: its own rendering (the model's tokenizer and template), the engine for ids."""

    def __init__(self, vllm: VLLMServer) -> None:
        from transformers import AutoTokenizer

        self.url = vllm.url
        self.tok = AutoTokenizer.from_pretrained(str(vllm.settings.model_dir))
        self.returned: list[ModelStepResult] = []

    def __call__(self, messages: list[dict[str, Any]], tools: list[Tool], sampling: dict[str, Any]) -> ModelStepResult:
        openai_tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                          "parameters": t.input_schema}} for t in tools]
        rendered = self.tok.apply_chat_template(_message_level(messages), tools=openai_tools or None, tokenize=True,
                                                add_generation_prompt=True)
        prompt = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
        reply = httpx.post(self.url + "/v1/completions", timeout=600, json={
            "model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0, "seed": 0,
            "return_token_ids": True, "logprobs": 0, "skip_special_tokens": True}).json()
        choice = reply["choices"][0]
        result = ModelStepResult(response=LLMResponse(content=choice["text"] or "Done."),
                                 prompt_ids=reply.get("prompt_token_ids") or prompt,
                                 completion_ids=choice["token_ids"],
                                 logprobs=choice["logprobs"]["token_logprobs"])
        self.returned.append(result)
        return result


def test_white_box_records_are_what_the_model_step_returned(vllm: VLLMServer, cli_paths) -> None:
    step = VLLMModelStep(vllm)
    adapter = AgentCLIAdapter("pi", timeout_s=300)
    try:
        result = adapter.run_white_box(step, TaskSession(BUILTIN_TASKS["fix-add"]), HarnessRunLimits(max_turns=2))
    finally:
        adapter.close()
    entries = [e for e in result.metrics["trace_entries"] if is_training_entry(e)]
    assert entries and len(entries) == len(step.returned)
    for entry, returned in zip(entries, step.returned):
        assert entry["prompt_token_ids"] == list(returned.prompt_ids)
        assert entry["completion_token_ids"] == list(returned.completion_ids)
        assert entry["per_token_logps"] == pytest.approx(list(returned.logprobs))
        assert entry["metadata"]["provenance"]["engine"].startswith("model_step")
    assert result.completion_ids == sum((list(r.completion_ids) for r in step.returned), [])
