"""The reference engine: a CPU test double of vLLM's OpenAI-compatible server.

It exists so that everything downstream -- recorder tests, real Pi/OpenCode runs, benchmarks,
demos -- can run without a GPU while seeing vLLM's exact wire format: a real byte-level BPE
tokenizer, a real (prefix-preserving) chat template, scripted turns with deterministic ids and
logprobs, vLLM's streaming chunks, its dev-mode pause/resume fence, and injectable faults.

Typical use::

    from openenv_harness.testing.engine import EngineServer, Script, Turn, ToolCallSpec

    with EngineServer() as engine:
        engine.set_script("*", Script(turns=[Turn(tool_calls=[ToolCallSpec(name="bash",
                                                   arguments={"command": "ls"})])]))
        ...  # point a client at engine.url + "/v1"
"""

from openenv_harness.testing.engine.app import create_engine_app
from openenv_harness.testing.engine.config import ENGINE_VERSION, SESSION_HEADER, EngineConfig, GenerationConfig
from openenv_harness.testing.engine.faults import Fault
from openenv_harness.testing.engine.policy import Script, ToolCallSpec, Turn
from openenv_harness.testing.engine.replay import agent_echo
from openenv_harness.testing.engine.server import EngineServer
from openenv_harness.testing.engine.template import ChatTemplate, reference_template
from openenv_harness.testing.engine.tokenizer import ReferenceTokenizer, is_noncanonical, reference_tokenizer

__all__ = [
    "ENGINE_VERSION",
    "SESSION_HEADER",
    "ChatTemplate",
    "EngineConfig",
    "EngineServer",
    "Fault",
    "GenerationConfig",
    "ReferenceTokenizer",
    "Script",
    "ToolCallSpec",
    "Turn",
    "agent_echo",
    "create_engine_app",
    "is_noncanonical",
    "reference_template",
    "reference_tokenizer",
]
