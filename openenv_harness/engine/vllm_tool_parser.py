"""vLLM tool-parser plugin ``openenv_json``: Hermes ``<tool_call>`` tags, and the JSON calls a small
model writes in plain text (``json_tool_calls.py`` says why).

Loaded by vLLM itself (``--tool-parser-plugin <this file> --tool-call-parser openenv_json``), in the
engine's own venv, where this package is not installed: the pure reading is loaded from the file
beside this one. Under ``tool_choice: "auto"`` with non-strict tools nothing constrains decoding, so
what the agent acts on is the policy's own sample. Streaming keeps Hermes' tag reading: the recorder asks the engine for whole
replies and streams them to the agent itself.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from vllm.entrypoints.generate.base.protocol import ExtractedToolCallInformation, FunctionCall, ToolCall
from vllm.tool_parsers.abstract_tool_parser import ToolParserManager
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

_NAME = "openenv_json_tool_calls"


def _reading() -> Any:
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    spec = importlib.util.spec_from_file_location(_NAME, Path(__file__).with_name("json_tool_calls.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


_parse = _reading().parse_json_tool_calls


@ToolParserManager.register_module("openenv_json")
class OpenEnvJSONToolParser(Hermes2ProToolParser):
    """Hermes' parser, structural tag included: decoding is constrained exactly where Hermes' is (the
    request's ``tool_choice`` required or named, or a tool declared ``strict``; the recorder records
    each as a constraint) and nowhere else; only the reading of unconstrained text is wider."""

    def extract_tool_calls(self, model_output: str, request: Any) -> ExtractedToolCallInformation:
        if self.tool_call_start_token in model_output:
            return super().extract_tool_calls(model_output, request)
        tools = getattr(request, "tools", None)
        names = [t.function.name for t in tools if getattr(t, "function", None) is not None] if tools else None
        parsed = _parse(model_output, names, getattr(self.model_tokenizer, "all_special_tokens", ()))
        if not parsed.calls:
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        calls = [ToolCall(type="function", function=FunctionCall(name=c.name, arguments=c.arguments))
                 for c in parsed.calls]
        return ExtractedToolCallInformation(tools_called=True, tool_calls=calls, content=parsed.content)
