"""Where agents run: the ``Sandbox`` interface and its local subprocess backend.

The Hugging Face backend lives in its own module and is imported from there (it pulls in
``huggingface_hub``); the local one is cheap and exported here.
"""

from openenv_harness.sandbox.base import BackgroundProcess, CommandResult, ModelEndpoint, Sandbox, SandboxError
from openenv_harness.sandbox.local import LocalProcess, LocalSandbox

__all__ = [
    "BackgroundProcess",
    "CommandResult",
    "LocalProcess",
    "LocalSandbox",
    "ModelEndpoint",
    "Sandbox",
    "SandboxError",
]
