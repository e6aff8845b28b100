"""Train the model behind an unmodified coding agent (Pi or OpenCode) with TRL's AsyncGRPO.

Hardware: NVIDIA Hopper GPUs (H100/H200) -- TRL's AsyncGRPO packs rows with an FlashAttention-3
tree kernel (``pip install kernels``). Two GPUs are the simple layout: GPU 0 serves the policy with
vLLM, GPU 1 trains. Software: ``pip install "openenv-harness[compat]" vllm aiohttp kernels`` (TRL's
rollout worker refuses to start without vLLM and aiohttp), Node 20 for the agent CLIs.

What runs where::

    agent CLI ──(base URL + per-rollout key)──▶ recorder ──(chat, return_token_ids, logprobs)──▶ vLLM
        ▲                                          │ one TraceEntry per call, policy version on each
        │ launched per rollout                     ▼
    TRL HarnessRolloutWorker (child process) ── TRLSessionFactory ── HarnessSession:
        create → wait_for_completion → fetch_training_trace → verify (the task's own tests)
    AsyncGRPOTrainer ── weights over NCCL straight to vLLM; pause/resume through the recorder's fence

1. Start vLLM with the command ``python examples/trl_async_grpo.py --print-commands`` prints
   (``VLLM_SERVER_DEV_MODE=1`` exposes ``/pause``, ``/resume`` and the weight-update routes; the
   token flags make vLLM return the ids the recorder records; the tool parser turns the model's
   tool-call text into the OpenAI ``tool_calls`` the agents execute).
2. Run ``CUDA_VISIBLE_DEVICES=1 python examples/trl_async_grpo.py``. It starts a recorder in this
   process in front of vLLM (or uses ``--recorder-url`` for one started as a process with the
   printed ``python -m openenv_harness.recorder`` command), checks that vLLM serves the chat
   template the trainer trains with, and trains.

Nothing here renders a chat template for training: TRL trains on the engine's own prompt ids.
Where the served template is not prefix-preserving (TRL's own check flags Qwen3's stock
template), a later prompt does not extend the earlier one token for token and TRL starts a new
training row there -- nothing is lost, but rows multiply (watch ``rollout/fork_frac``).
``--serve-training-template`` serves TRL's prefix-preserving version of the template instead.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from openenv_harness.recorder import RecorderConfig, RecorderServer
from openenv_harness.rollout import BUILTIN_TASKS, TRLSessionFactory
from openenv_harness.trainer import install_recorder_fence, template_fingerprint


@dataclass
class ExampleConfig:
    """Every knob of the run, with the defaults the printed commands use."""

    model: str = "Qwen/Qwen3-1.7B"
    harness: str = "pi"
    tasks: tuple[str, ...] = tuple(BUILTIN_TASKS)
    vllm_host: str = "127.0.0.1"
    vllm_port: int = 8000
    tool_call_parser: str = "hermes"
    reasoning_parser: str | None = "qwen3"
    max_model_len: int = 32768
    served_template_path: str | None = None  # vLLM --chat-template; None serves the model's own
    recorder_url: str | None = None  # an external recorder; None starts one in this process
    recorder_host: str = "127.0.0.1"
    recorder_port: int = 8765
    admin_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    store: str = "runs/trl-recorder.db"
    output_dir: str = "runs/trl-async-grpo"
    num_generations: int = 8
    max_steps: int = 200
    temperature: float = 1.0
    max_output_tokens: int = 4096
    max_inflight_tasks: int = 16
    budgets: dict[str, Any] = field(default_factory=lambda: {"max_agent_calls": 32, "max_wall_clock_s": 900.0})

    @property
    def vllm_url(self) -> str:
        return f"http://{self.vllm_host}:{self.vllm_port}"

    @property
    def in_process_recorder_url(self) -> str:
        return f"http://{self.recorder_host}:{self.recorder_port}"


# -- the two servers -----------------------------------------------------------------------------


def vllm_serve_command(cfg: ExampleConfig) -> tuple[dict[str, str], list[str]]:
    """The environment and argv of the vLLM server this example trains against."""
    env = {"VLLM_SERVER_DEV_MODE": "1"}  # /pause, /resume, /init_weight_transfer_engine, /update_weights
    argv = [
        "vllm", "serve", cfg.model,
        "--host", cfg.vllm_host, "--port", str(cfg.vllm_port),
        "--max-model-len", str(cfg.max_model_len),
        "--dtype", "bfloat16",  # the trainer loads the model in the same dtype (build_config)
        "--return-tokens-as-token-ids",  # logprob entries name their token id: the recorder pairs them exactly
        "--logprobs-mode", "processed_logprobs",  # logprobs of the distribution actually sampled (temperature)
        "--enable-auto-tool-choice", "--tool-call-parser", cfg.tool_call_parser,
        "--weight-transfer-config", '{"backend":"nccl"}',  # TRL streams new weights over NCCL
    ]
    if cfg.reasoning_parser:
        argv += ["--reasoning-parser", cfg.reasoning_parser]
    if cfg.served_template_path:
        argv += ["--chat-template", cfg.served_template_path]
    return env, argv


def recorder_command(cfg: ExampleConfig) -> list[str]:
    """The recorder as a process of its own (instead of ``build_recorder``)."""
    return [
        sys.executable, "-m", "openenv_harness.recorder", "--engine-url", cfg.vllm_url,
        "--host", cfg.recorder_host, "--port", str(cfg.recorder_port),
        # one argument with "=": a generated token may start with "-", which argparse would read as an option
        "--store", cfg.store, f"--admin-token={cfg.admin_token}",
    ]


def format_command(env: dict[str, str], argv: list[str]) -> str:
    return " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.quote(a) for a in argv])


def wait_for_engine(url: str, timeout_s: float = 600.0) -> None:
    """Block until the engine answers ``/health``: the recorder probes its template when it starts."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no engine answered at {url}/health within {timeout_s:g}s")
        time.sleep(min(2.0, remaining))


def build_recorder(cfg: ExampleConfig) -> RecorderServer:
    """A recorder in this process, in front of the engine; ``.start()`` it (or use ``with``).

    ``pause_wait_s`` covers a whole weight sync: agent calls that arrive during one wait at the
    recorder instead of failing with a retryable 503 that a retry-less agent would give up on.
    """
    config = RecorderConfig(
        store_path=cfg.store, engine_url=cfg.vllm_url, admin_token=cfg.admin_token,
        pause_wait_s=600.0, upstream_timeout_s=900.0,
    )
    return RecorderServer(config, host=cfg.recorder_host, port=cfg.recorder_port)


# -- the rollout side ------------------------------------------------------------------------------


def write_served_template(tokenizer: Any, path: str | Path) -> str | None:
    """Write TRL's prefix-preserving version of the tokenizer's template for vLLM ``--chat-template``.

    Returns the template text, or ``None`` when the model's own template already preserves
    prefixes (then nothing is written and vLLM serves the model's template).
    """
    from trl.chat_template_utils import get_training_chat_template

    text = get_training_chat_template(tokenizer)
    if text is None:
        return None
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text, encoding="utf-8")
    return text


def build_session_factory(cfg: ExampleConfig, recorder_url: str, trainer_fingerprint: str | None) -> TRLSessionFactory:
    """TRL's ``harness_session_factory``: picklable, called in the worker with the training sampling.

    With ``trainer_fingerprint`` every session checks that the engine serves the trainer's template
    (a mismatch fails the session, which TRL scores as an unscorable rollout).
    """
    return TRLSessionFactory(
        harness=cfg.harness, recorder_url=recorder_url, admin_token=cfg.admin_token, model=cfg.model,
        budgets=dict(cfg.budgets), context_window=cfg.max_model_len, max_output_tokens=cfg.max_output_tokens,
        metadata={"run": Path(cfg.output_dir).name}, trainer_template_fingerprint=trainer_fingerprint,
    )


def build_dataset(task_ids: tuple[str, ...] | list[str]) -> Any:
    """One conversational prompt per task; the session factory resolves the text to the task."""
    from datasets import Dataset

    unknown = [t for t in task_ids if t not in BUILTIN_TASKS]
    if unknown:
        raise ValueError(f"unknown task ids {unknown}; built-in tasks are {sorted(BUILTIN_TASKS)}")
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": t}] for t in task_ids]})


def rollout_worker_kwargs(
    cfg: ExampleConfig, tokenizer: Any, dataset: Any, factory: TRLSessionFactory
) -> dict[str, Any]:
    """The keyword arguments of TRL's ``HarnessRolloutWorker``; all picklable (they cross a spawn)."""
    return dict(
        harness_session_factory=factory,
        model_name=cfg.model,
        dataset=dataset,
        reward_funcs=[],  # the reward is the environment's verify(), via the session
        processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],  # unused in loop-owning mode: the agent owns generation
        num_generations=cfg.num_generations,
        max_inflight_tasks=cfg.max_inflight_tasks,
        vllm_server_url=cfg.vllm_url,
        max_tokens=cfg.max_output_tokens,
        temperature=cfg.temperature,  # top_p/top_k stay off: training sampling is full-vocabulary
        request_timeout=900,
    )


def async_grpo() -> tuple[Any, Any, str]:
    """TRL's ``(AsyncGRPOConfig, AsyncGRPOTrainer)`` and the module they came from: the stable path of
    TRL >= 1.18 (``trl.trainer.async_grpo_trainer``; the experimental one warns there until 2.0) where it
    exists, else the experimental path of TRL 1.16 / 1.17. Only the fallback runs where TRL 1.18 cannot
    be installed; the stable path is read from TRL's release notes, not run."""
    import importlib

    for name in ("trl.trainer.async_grpo_trainer", "trl.experimental.async_grpo"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        config, trainer = getattr(module, "AsyncGRPOConfig", None), getattr(module, "AsyncGRPOTrainer", None)
        if config is None:  # the stable trainer module may keep its config beside it
            try:
                config = importlib.import_module(name.replace("_trainer", "_config")).AsyncGRPOConfig
            except (ImportError, AttributeError):
                config = None
        if config is not None and trainer is not None:
            return config, trainer, name
    raise ImportError("TRL's AsyncGRPO is not installed: pip install 'openenv-harness[compat]' (TRL >= 1.16)")


def build_rollout_worker(kwargs: dict[str, Any]) -> Any:
    from trl.experimental.async_grpo.openenv_harness import HarnessRolloutWorker

    return HarnessRolloutWorker(**kwargs)


# -- the trainer side ------------------------------------------------------------------------------


def build_config(cfg: ExampleConfig, **overrides: Any) -> Any:
    AsyncGRPOConfig, _trainer, _where = async_grpo()
    settings: dict[str, Any] = dict(
        output_dir=cfg.output_dir,
        num_generations=cfg.num_generations,
        max_completion_length=cfg.max_output_tokens,
        temperature=cfg.temperature,  # the trainer's logprobs use it too: the same value the worker samples with
        vllm_server_base_url=cfg.vllm_url,  # weight sync and max_model_len go to vLLM itself
        dtype="bfloat16",
        max_steps=cfg.max_steps,
        weight_sync_steps=1,
        max_staleness=2,
        max_inflight_tasks=cfg.max_inflight_tasks,
        request_timeout=900,
        logging_steps=1,
        report_to="none",
    )
    settings.update(overrides)
    return AsyncGRPOConfig(**settings)


def build_trainer(
    cfg: ExampleConfig, config: Any, dataset: Any, tokenizer: Any, worker: Any, recorder_url: str
) -> Any:
    """``AsyncGRPOTrainer`` with our rollout worker, its weight-sync fence routed through the recorder."""
    _config, AsyncGRPOTrainer, _where = async_grpo()
    trainer = AsyncGRPOTrainer(
        model=cfg.model, args=config, train_dataset=dataset, processing_class=tokenizer, rollout_worker=worker,
    )
    install_recorder_fence(trainer, recorder_url, cfg.admin_token)
    return trainer


# -- entry point ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> tuple[ExampleConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=ExampleConfig.model)
    p.add_argument("--harness", default=ExampleConfig.harness, choices=["pi", "opencode"])
    p.add_argument("--tasks", default=",".join(BUILTIN_TASKS), help="comma-separated built-in task ids")
    p.add_argument("--vllm-port", type=int, default=ExampleConfig.vllm_port)
    p.add_argument("--tool-call-parser", default=ExampleConfig.tool_call_parser)
    p.add_argument("--reasoning-parser", default=ExampleConfig.reasoning_parser, help="'' for none")
    p.add_argument("--recorder-url", default=None, help="use a recorder started as a process")
    p.add_argument("--recorder-port", type=int, default=ExampleConfig.recorder_port)
    p.add_argument("--admin-token", default=os.environ.get("OEH_ADMIN_TOKEN"))
    p.add_argument("--output-dir", default=ExampleConfig.output_dir)
    p.add_argument("--num-generations", type=int, default=ExampleConfig.num_generations)
    p.add_argument("--max-steps", type=int, default=ExampleConfig.max_steps)
    p.add_argument("--serve-training-template", action="store_true",
                   help="serve TRL's prefix-preserving version of the model's template (vLLM --chat-template)")
    p.add_argument("--print-commands", action="store_true", help="print the vLLM and recorder commands and exit")
    a = p.parse_args(argv)
    cfg = ExampleConfig(
        model=a.model, harness=a.harness, tasks=tuple(t for t in a.tasks.split(",") if t),
        vllm_port=a.vllm_port, tool_call_parser=a.tool_call_parser, reasoning_parser=a.reasoning_parser or None,
        recorder_url=a.recorder_url, recorder_port=a.recorder_port, output_dir=a.output_dir,
        num_generations=a.num_generations, max_steps=a.max_steps,
    )
    if a.admin_token:
        cfg.admin_token = a.admin_token
    if a.serve_training_template:
        cfg.served_template_path = str(Path(cfg.output_dir).resolve() / "served_chat_template.jinja")
    return cfg, a


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(argv)
    template_text: str | None = None
    tokenizer = None
    if args.serve_training_template or not args.print_commands:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    if args.serve_training_template:  # written before vLLM starts: it is vLLM's --chat-template
        template_text = write_served_template(tokenizer, cfg.served_template_path)
        if template_text is None:
            cfg.served_template_path = None
    if args.print_commands:
        print("# 1. the policy server (GPU 0)")
        print("CUDA_VISIBLE_DEVICES=0 " + format_command(*vllm_serve_command(cfg)))
        print("# 2. optional: the recorder as its own process (then pass --recorder-url)")
        print(format_command({}, recorder_command(cfg)))
        print("# 3. this script (GPU 1)")
        rest = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--print-commands"]
        print(format_command({"CUDA_VISIBLE_DEVICES": "1", "OEH_ADMIN_TOKEN": cfg.admin_token},
                             [sys.executable, __file__, *rest]))
        return 0

    from openenv_harness.harnesses.install import ensure_installed

    ensure_installed([cfg.harness])
    fingerprint = template_fingerprint(tokenizer, chat_template=template_text)
    wait_for_engine(cfg.vllm_url)
    recorder = None if cfg.recorder_url else build_recorder(cfg).start()
    recorder_url = cfg.recorder_url or cfg.in_process_recorder_url
    try:
        factory = build_session_factory(cfg, recorder_url, fingerprint)
        dataset = build_dataset(cfg.tasks)
        worker = build_rollout_worker(rollout_worker_kwargs(cfg, tokenizer, dataset, factory))
        trainer = build_trainer(cfg, build_config(cfg), dataset, tokenizer, worker, recorder_url)
        trainer.train()
    finally:
        if recorder is not None:
            recorder.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
