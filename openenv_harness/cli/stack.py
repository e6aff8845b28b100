"""The pieces a local run needs: an engine (the embedded reference engine unless a URL is given)
and a recorder in front of it, both on loopback.

The embedded engine is the project's CPU test double of vLLM (``openenv_harness.testing.engine``):
it serves each built-in task's scripted solution, so the demo drives the real agents through real
multi-turn tool use with no GPU and no network. With ``--engine-url`` the same run goes to a real
vLLM instead.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from openenv_harness.harnesses.base import HarnessOptions
from openenv_harness.harnesses.cline import SUBAGENT_TOOLS as CLINE_SUBAGENT_TOOLS
from openenv_harness.harnesses.cline import WEB_TOOLS as CLINE_WEB_TOOLS
from openenv_harness.recorder.auth import new_admin_token
from openenv_harness.recorder.context import RecorderConfig
from openenv_harness.recorder.server import RecorderServer
from openenv_harness.rollout.tasks import Task


#: What rollouts on the project's real engine pin: greedy and seeded (reproducible), and tool calls
#: required -- the 0.5B model answers tool requests with a JSON code block unless constrained, so
#: without it no rollout would ever use a tool (the constraint is recorded on every call); and at most
#: 256 sampled tokens a call: Claude Code asks for 32,000, which a CPU engine samples for an hour when
#: the grammar lets the model write a whole file into one tool call.
REAL_ENGINE_SAMPLING: dict[str, Any] = {"temperature": 0, "seed": 0, "tool_choice": "required", "max_tokens": 256}


def real_engine_sampling(*, unconstrained: bool) -> dict[str, Any]:
    """What a rollout on the project's real engine pins. Unconstrained (a training sampling policy runs
    the agent): no ``tool_choice`` -- a constraint's samples are not the policy's -- the agent calls
    tools freely, helped by the model's tool-call hint (``LocalStack.options_for``)."""
    pinned = dict(REAL_ENGINE_SAMPLING)
    if unconstrained:
        pinned.pop("tool_choice")
    return pinned


#: What agents run with on the project's real engine where their defaults cannot finish a turn on a CPU:
#: Claude Code's default prompt (its system prompt and every tool's schema) is ~12k ids, minutes of prefill
#: a call on a CPU without AVX-512; its own ``--tools`` and ``--system-prompt`` make it ~3k (the same CLI,
#: the same Messages wire format), and its short Edit calls fit the pinned token cap where Write's do not.
#: a short system prompt for the agents whose own is too long for a CPU to prefill in a rollout's time
SHORT_SYSTEM_PROMPT = "You are a coding agent working in the current directory. Use the tools to read, edit and test code."

REAL_ENGINE_OPTIONS: dict[str, HarnessOptions] = {
    "claude-code": HarnessOptions(extra_args=("--tools", "Bash,Read,Edit"), system_prompt=SHORT_SYSTEM_PROMPT),
    # its own prompt is ~18k ids, most of them the schemas of tools a task here does not need
    "gemini-cli": HarnessOptions(system_prompt=SHORT_SYSTEM_PROMPT, config_overrides={
        "tools": {"core": ["run_shell_command", "read_file", "replace"]}}),
    # its own is ~26k ids (a system prompt, a skills reminder, 14 tools' schemas)
    "qwen-code": HarnessOptions(system_prompt=SHORT_SYSTEM_PROMPT, config_overrides={
        "tools": {"core": ["run_shell_command", "read_file", "edit"]},
        "skills": {"disabledLevels": ["project", "user", "extension", "bundled"]}}),
    # its own is ~4k ids; the same short prompt (--system) and three tools bring it near 2k
    "cline": HarnessOptions(system_prompt=SHORT_SYSTEM_PROMPT, config_overrides={"disabledTools": [
        *CLINE_SUBAGENT_TOOLS, *CLINE_WEB_TOOLS, "search_codebase", "ask_question"]}),
    # its own is ~18k ids; without its task, board, wake-up, background, recall, todo and skill tools
    # (and their parts of the system prompt) about half
    "kilo": HarnessOptions(config_overrides={"tools": dict.fromkeys((
        "task", "board_post", "board_read", "schedule_wakeup", "cancel_wakeup", "background_process",
        "kilo_local_recall", "todowrite", "skill"), False)}),
}


class LocalStack:
    """``engine``: ``reference`` (embedded test double), ``vllm`` (the project's real vLLM, installed
    and started here), ``sglang`` (the real SGLang on its CPU engine, installed and started here) or
    ``url`` (a real engine somebody else runs, at ``engine_url``)."""

    def __init__(self, *, engine_url: str | None, store_path: str, model: str | None,
                 tasks: list[Task], segmentation: str = "canonical", admin_token: str | None = None,
                 engine: str | None = None, progress: Any = None, chat_template: Path | None = None,
                 recorder_url: str | None = None, logprobs_mode: str | None = None,
                 unconstrained: bool = False, system_prompt_suffix: str | None = None,
                 kv_cache_gib: int | None = None, engine_family: str = "vllm") -> None:
        #: whose routes the engine serves (the embedded engine serves that family's wire too)
        self.engine_family = engine_family
        #: the KV cache the engine started here reserves (None: the launcher's default)
        self.kv_cache_gib = kv_cache_gib
        self.engine_url = engine_url
        #: the project's vLLM samples the agent's calls freely (a training sampling policy is pinned):
        #: no tool_choice constraint, and the model's tool-call hint appended to the agent's system prompt
        self.unconstrained = unconstrained
        #: appended to every agent's system prompt (its own flag); the model's hint where unconstrained
        self.system_prompt_suffix = system_prompt_suffix
        #: vLLM --logprobs-mode for the engine started here (None: vLLM's default, raw_logprobs)
        self.logprobs_mode = logprobs_mode
        #: a recorder somebody else runs (``serve``): nothing is started here, its engine is its own
        self.remote_recorder = recorder_url
        #: the template the engine started here serves instead of the model's own
        self.chat_template = chat_template
        self.engine_kind = engine or ("url" if engine_url else "reference")
        self.store_path = store_path
        self.model = model
        self.tasks = tasks
        self.segmentation = segmentation
        self.admin_token = admin_token or new_admin_token()
        self.progress = progress or (lambda _m: None)
        self.engine: Any = None
        self.recorder: RecorderServer | None = None
        self.sampling: dict[str, Any] | None = None

    @property
    def embedded(self) -> bool:
        return self.engine_kind == "reference" and self.remote_recorder is None

    @property
    def recorder_url(self) -> str:
        if self.remote_recorder is not None:
            return self.remote_recorder
        assert self.recorder is not None, "the stack is not started"
        return self.recorder.url

    def model_for(self, task: Task, harness: str | None = None) -> str:
        """The model name a rollout of ``task`` by ``harness`` asks for (the embedded engine's script key:
        one per shell-tool spelling, ``rollout.taskset.script_for``)."""
        if self.embedded or self.model == "reference":  # "reference": a standalone reference engine's task scripts
            from openenv_harness.rollout.taskset import reference_model_name

            return reference_model_name(task.id, harness)
        assert self.model is not None
        return self.model

    def options_for(self, harness: str) -> HarnessOptions | None:
        """The agent's options on this stack: the real-engine ones where the project's vLLM runs here, and
        the system-prompt suffix where there is one."""
        real = self.engine_kind in ("vllm", "sglang")
        options = REAL_ENGINE_OPTIONS.get(harness) if real else None
        suffix = self.system_prompt_suffix
        if suffix is None and self.unconstrained and real:
            from openenv_harness.engine.model import QWEN25_CODER_05B
            from openenv_harness.harnesses.registry import get_preset

            if get_preset(harness).append_system_prompt_flag is not None:
                suffix = QWEN25_CODER_05B.tool_call_hint
        if suffix:
            options = (options or HarnessOptions()).model_copy(update={"system_prompt_suffix": suffix})
        return options

    def _start_vllm(self) -> tuple[str, dict[str, Any]]:
        from openenv_harness.engine import VLLMServer, VLLMSettings, ensure_engine
        from openenv_harness.engine.launcher import sampling_defaults
        from openenv_harness.engine.model import QWEN25_CODER_05B as spec

        python, model_dir = ensure_engine(spec, progress=self.progress)
        settings = VLLMSettings(model_dir=model_dir, served_name=spec.served_name, python=python,
                                max_model_len=spec.max_model_len, chat_template=self.chat_template,
                                logprobs_mode=self.logprobs_mode,
                                **({"kv_cache_gib": self.kv_cache_gib} if self.kv_cache_gib else {}))
        self.progress("starting vLLM (about a minute and a half; the first start compiles)")
        self.engine = VLLMServer(settings, log_path=Path(self.store_path).parent / "vllm.log").start(timeout_s=900)
        self.model = spec.served_name
        self.sampling = real_engine_sampling(unconstrained=self.unconstrained)
        # declared as started (vLLM's default is raw); the recorder measures it and records the measurement
        return self.engine.url, {"engine_sampling_defaults": sampling_defaults(model_dir),
                                 "engine_logprobs_mode": self.logprobs_mode or "raw_logprobs"}

    def _start_sglang(self) -> tuple[str, dict[str, Any]]:
        from openenv_harness.engine.launcher import sampling_defaults
        from openenv_harness.engine.sglang_cpu import SGLangServer, SGLangSettings, ensure_sglang

        python, model_dir = ensure_sglang(progress=self.progress)
        self.progress("starting SGLang on its CPU engine (about half a minute)")
        self.engine = SGLangServer(SGLangSettings(model_dir=model_dir, python=python),
                                   log_path=Path(self.store_path).parent / "sglang.log").start(timeout_s=900)
        self.engine_family = "sglang"
        self.model = self.engine.settings.served_name
        self.sampling = real_engine_sampling(unconstrained=self.unconstrained)
        # SGLang's chat route fills fields a request leaves out from the model's generation config
        # (its --sampling-defaults model, the default); its logprobs mode is measured by the recorder
        return self.engine.url, {"engine_sampling_defaults": sampling_defaults(model_dir)}

    def __enter__(self) -> "LocalStack":
        if self.remote_recorder is not None:
            return self
        url = self.engine_url
        extra: dict[str, Any] = {}
        Path(self.store_path).parent.mkdir(parents=True, exist_ok=True)
        if self.engine_kind == "vllm":
            url, extra = self._start_vllm()
        elif self.engine_kind == "sglang":
            url, extra = self._start_sglang()
        elif url is None:
            from openenv_harness.rollout.taskset import builtin_task_scripts
            from openenv_harness.testing.engine import EngineConfig, EngineServer, Script

            scripts = {name: Script(turns=turns, segmentation=self.segmentation)
                       for name, turns in builtin_task_scripts(self.tasks).items()}
            self.engine = EngineServer(EngineConfig(chat_template=self.chat_template, scripts=scripts,
                                                    family=self.engine_family)).start()
            url = self.engine.url
        config = RecorderConfig(store_path=self.store_path, engine_url=url, admin_token=self.admin_token,
                                engine_family=self.engine_family, **extra)
        try:
            self.recorder = RecorderServer(config).start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.recorder is not None:
            self.recorder.stop()
        if self.engine is not None:
            self.engine.stop()


def default_run_dir() -> str:
    return os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
