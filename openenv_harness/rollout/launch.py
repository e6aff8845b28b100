"""Start one agent CLI in one sandbox against one recorder session.

The order matters and is the whole reason for this module: the agent's config files name the
session's base URL, their hashes belong in the session's provenance (D11), and the session's
secret exists only once the session is created. So: choose the session id, ask the sandbox what
endpoint the agent will see (a relay URL remotely), render the files, create the session with their
hashes, then render again with the real key (which travels in the environment, never in a file)
and start the agent.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

from openenv_harness.harnesses.base import HarnessOptions, HarnessPreset, HarnessResult, HarnessSetup, LaunchSpec
from openenv_harness.harnesses.launch import place_files
from openenv_harness.recorder.client import RecorderClient
from openenv_harness.sandbox.base import BackgroundProcess, Sandbox

log = logging.getLogger(__name__)


@dataclass
class LaunchedAgent:
    """A running agent and what it needs to be read back."""

    preset: HarnessPreset
    sandbox: Sandbox
    spec: LaunchSpec
    process: BackgroundProcess
    session_id: str
    session_info: dict[str, Any]
    started_at: float

    def wait(self, timeout_s: float | None = None) -> int | None:
        return self.process.wait(timeout_s)

    def kill(self) -> None:
        self.process.kill()

    def output(self) -> tuple[str, str]:
        def read(path: str) -> str:
            try:
                return self.sandbox.read_file(path).decode("utf-8", "replace")
            except Exception:
                return ""

        return read(self.process.stdout_path), read(self.process.stderr_path)

    def result(self) -> HarnessResult:
        stdout, stderr = self.output()
        return self.preset.parse_output(self.process.poll(), stdout, stderr)


def resolve_options(options: HarnessOptions, sandbox: Sandbox) -> HarnessOptions:
    """Settle what the sandbox decides: retries (left ``None``) are on where the agent reaches the
    recorder over a path of its own (``Sandbox.remote``). One WebSocket blip must not end a remote
    rollout, and a retry is safe: it is byte-identical, so the recorder answers it from the first
    attempt (its in-flight twin or its record), never with a second sample. Locally the only
    failures are the recorder's and the engine's own, which a retry would not cure."""
    if options.retries is None:
        return options.model_copy(update={"retries": sandbox.remote})
    return options


def new_session_id() -> str:
    return "r-" + secrets.token_hex(8)


def launch_agent(
    *,
    preset: HarnessPreset,
    sandbox: Sandbox,
    client: RecorderClient,
    recorder_url: str,
    instruction: str,
    model: str,
    executable: str | None = None,
    options: HarnessOptions | None = None,
    context_window: int = 32768,
    max_output_tokens: int = 4096,
    budgets: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    sampling: dict[str, Any] | None = None,
    training_temperature: float | None = None,
    upstream: str | None = None,
    trainer_template_fingerprint: str | None = None,
    prompt_mode: str = "full_history",
    prompt_mode_strict: bool = False,
    require_exact_template: bool = False,
    session_id: str | None = None,
) -> LaunchedAgent:
    session_id = session_id or new_session_id()
    base_url = f"{recorder_url.rstrip('/')}/rollout/{session_id}/v1"
    endpoint = sandbox.model_endpoint(base_url, "pending")
    options = resolve_options(options or HarnessOptions(), sandbox)

    def setup_for(ep: Any) -> HarnessSetup:
        return HarnessSetup(
            endpoint=ep, model=model, workdir=sandbox.workdir, home=sandbox.home,
            context_window=context_window, max_output_tokens=max_output_tokens,
            options=options,
        )

    draft = preset.prepare(setup_for(endpoint), instruction, executable)
    spec: dict[str, Any] = {
        "session_id": session_id,
        "harness": preset.name,
        "harness_version": preset.version,
        "config_hashes": draft.config_hashes(),
        "aux_rules": [rule.as_flat() for rule in preset.aux_rules] + [
            {"name": "no-tools", "no_tools": True}
        ],
        "budgets": budgets or {},
        "metadata": metadata or {},
    }
    if sampling:
        spec["sampling"] = sampling
    if training_temperature is not None:
        spec["training_sampling"] = {"temperature": training_temperature}
    if upstream:
        spec["upstream"] = upstream
    if trainer_template_fingerprint:
        spec["trainer_template_fingerprint"] = trainer_template_fingerprint
    if prompt_mode != "full_history" or prompt_mode_strict:  # the recorder's SessionSpec validates both
        spec.update(prompt_mode=prompt_mode, prompt_mode_strict=prompt_mode_strict)
    if require_exact_template:  # the recorder refuses the session (409) where its template is not certified
        spec["require_exact_template"] = True
    info = client.create_session(**spec)
    for warning in info.get("warnings") or []:  # the recorder's own words (e.g. a template not exact in this mode)
        log.warning("session %s: %s", session_id, warning)
    launch = preset.prepare(setup_for(replace(endpoint, api_key=info["secret"])), instruction, executable)
    if launch.files != draft.files:
        raise RuntimeError(f"{preset.name}: config files depend on the API key; refusing to leak it into files")
    place_files(sandbox, launch)
    process = sandbox.start(launch.argv, env=launch.env, cwd=launch.cwd, stdin=launch.stdin, name=preset.name)
    return LaunchedAgent(
        preset=preset, sandbox=sandbox, spec=launch, process=process, session_id=session_id,
        session_info={k: v for k, v in info.items() if k != "secret"}, started_at=time.time(),
    )
