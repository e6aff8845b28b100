"""Choosing a sandbox by name, as the command line and the training loop do.

Why the local sandbox's limits are spelled out here: it is the default, and during RL the agent runs
whatever commands a partly trained policy writes. A run that trains with it says so once, in these
words, so nobody learns it from a deleted home directory.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from openenv_harness.sandbox.base import Sandbox, SandboxError

SANDBOX_KINDS = ("local", "docker", "podman", "hf")

#: What the local sandbox does not isolate (also in docs/sandboxes.md).
LOCAL_SANDBOX_LIMITS = (
    "the local sandbox gives each rollout a private directory, HOME and environment, but the agent's "
    "commands run as you, on your filesystem and your network: they can read and delete your files, "
    "reach any host, and use all CPU and memory. Train with --sandbox docker (a container each, no "
    "network but the model endpoint) where the policy's commands are not trusted"
)


def sandbox_factory(kind: str, image: str | None = None) -> Callable[[], Sandbox] | None:
    """A factory for sandboxes of ``kind`` (None: the local default), checked now: a missing
    container engine or image is said before any rollout starts, not as every rollout's failure."""
    if image is not None and kind not in ("docker", "podman"):
        raise SandboxError("an image is for a container sandbox (docker or podman)")
    if kind == "local":
        return None
    if kind == "hf":
        from openenv_harness.sandbox.hf import HFSandbox

        return HFSandbox
    if kind in ("docker", "podman"):
        from openenv_harness.sandbox.container import ContainerSandbox
        from openenv_harness.sandbox.container_engine import require_container_engine
        from openenv_harness.sandbox.container_image import DEFAULT_IMAGE, image_present

        engine = require_container_engine(kind)
        chosen = image or DEFAULT_IMAGE
        if not image_present(engine, chosen):
            how = ("build it: python -m openenv_harness.sandbox.container_image" if image is None
                   else f"pull or build {chosen} first")
            raise SandboxError(f"the container image {chosen} is not present: {how}")
        return functools.partial(ContainerSandbox, engine=engine, image=chosen)
    raise SandboxError(f"unknown sandbox {kind!r}: use one of {', '.join(SANDBOX_KINDS)}")
