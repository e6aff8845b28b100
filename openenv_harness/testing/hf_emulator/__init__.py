"""A local emulator of Hugging Face Jobs sandboxes, for tests (a test double; never imported by
product code). Written from the wire protocol the ``huggingface_hub`` client speaks."""

from openenv_harness.testing.hf_emulator.client import client_environment, hub_pointed_at
from openenv_harness.testing.hf_emulator.jobs import EmulatedJob, EmulatedSandbox
from openenv_harness.testing.hf_emulator.server import HFEmulator

__all__ = ["EmulatedJob", "EmulatedSandbox", "HFEmulator", "client_environment", "hub_pointed_at"]
