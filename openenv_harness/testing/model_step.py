"""A scripted ``ModelStep``: a test double for the trainer's policy sampler in RFC 005 white-box mode.

It does what a trainer's sampler does around the forward pass -- renders the agent's messages and
tools with the reference chat template, tokenizes the prompt, and returns the ids and logprobs of
the assistant turn it "sampled" -- but the turn comes from a script: tests need to know what the
model says, and that the ids it returned are what the recorder stores and the result carries.
"""

from __future__ import annotations

import json
from typing import Any

from openenv.core.env_server.mcp_types import Tool
from openenv.core.harness import ModelStepResult
from openenv.core.llm_client import LLMResponse, ToolCall

from openenv_harness.testing.engine import reference_template, reference_tokenizer


class ScriptedModelStep:
    """``commands[i]`` is turn i's bash command (or a list of them: several tool calls in one turn);
    after the script, ``final`` is the answer. ``calls`` records each ``(turn, tools, sampling)``."""

    def __init__(self, commands: list[str | list[str]], final: str) -> None:
        self.commands = commands
        self.final = final
        self.calls: list[tuple[int, list[Tool], dict[str, Any]]] = []
        self.tok = reference_tokenizer()
        self.template = reference_template()

    def __call__(self, messages: list[dict[str, Any]], tools: list[Tool], sampling: dict[str, Any]) -> ModelStepResult:
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        self.calls.append((turn, tools, sampling))
        openai_tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                          "parameters": t.input_schema}} for t in tools]
        prompt_ids = self.tok.encode(self.template.render(messages, openai_tools, True))
        if turn < len(self.commands):
            step = self.commands[turn]
            batch = [step] if isinstance(step, str) else list(step)
            args = [{"command": c} for c in batch]
            response = LLMResponse(content="", tool_calls=[
                ToolCall(id=f"call_{turn}_{i}", name="bash", args=a) for i, a in enumerate(args)])
            message: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "bash", "arguments": json.dumps(a, separators=(",", ":"))}}
                for a in args]}
        else:
            response = LLMResponse(content=self.final)
            message = {"role": "assistant", "content": self.final}
        completion = self.tok.encode(self.template.render_sampled_turn(message))
        logprobs = [-0.01 - (i % 7) / 10 for i in range(len(completion))]
        return ModelStepResult(response=response, prompt_ids=prompt_ids, completion_ids=completion, logprobs=logprobs)
